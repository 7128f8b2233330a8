"""Load generator for OpenAI-compatible servers: open-loop Poisson arrivals, streamed requests, client-side
TTFT, inter-chunk latency, TPOT and end-to-end percentiles.

    report = run_load(["http://127.0.0.1:8000"], qps=4, duration=60)
    print(report.to_text())

    python -m specdeploy_engine.loadgen --target http://127.0.0.1:8000 --qps "0-60s:2,60-120s:8" --duration 120s

`run_load` takes base URLs (a Service's endpoints, the simulators of one SpeculativeDeployment) and
spreads requests over them round-robin or at random, as a Service would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
from collections.abc import Sequence

from specdeploy_engine.loadgen.client import MAX_CONNECTIONS, PROMPT_WORDS, TargetUnreachable, send_workload
from specdeploy_engine.loadgen.report import LoadReport, RequestRecord, Summary
from specdeploy_engine.loadgen.workload import (
    Lengths,
    PlannedRequest,
    QpsSchedule,
    TemperatureMix,
    Workload,
    WorkloadError,
)

__all__ = [
    "Lengths", "LoadReport", "PlannedRequest", "QpsSchedule", "RequestRecord", "Summary", "TargetUnreachable",
    "TemperatureMix", "Workload", "WorkloadError", "main", "parse_duration", "run_load", "run_load_async",
]

DEFAULT_PROMPT = "lognormal:256,0.5,8,4096"
DEFAULT_OUTPUT = "lognormal:128,0.5,8,1024"
DEFAULT_TEMPERATURE = "0"


def _schedule(qps: float | str | QpsSchedule) -> QpsSchedule:
    if isinstance(qps, QpsSchedule):
        return qps
    return QpsSchedule.parse(str(qps))


def _lengths(value: str | int | Lengths) -> Lengths:
    return value if isinstance(value, Lengths) else Lengths.parse(str(value))


def _temperatures(value: str | float | TemperatureMix) -> TemperatureMix:
    return value if isinstance(value, TemperatureMix) else TemperatureMix.parse(str(value))


async def run_load_async(
    targets: Sequence[str],
    qps: float | str | QpsSchedule,
    duration: float,
    *,
    max_requests: int | None = None,
    prompt_tokens: str | int | Lengths = DEFAULT_PROMPT,
    output_tokens: str | int | Lengths = DEFAULT_OUTPUT,
    temperature: str | float | TemperatureMix = DEFAULT_TEMPERATURE,
    chat: bool = False,
    model: str | None = None,
    balance: str = "round-robin",
    seed: int = 0,
    drain_seconds: float = 60.0,
    max_connections: int = MAX_CONNECTIONS,
    stream: bool = True,
    stop: threading.Event | None = None,
    stop_drain_seconds: float | None = None,
    prompt_words: Sequence[str] = PROMPT_WORDS,
) -> LoadReport:
    """`run_load` for callers already in an event loop."""
    workload = Workload(_schedule(qps), _lengths(prompt_tokens), _lengths(output_tokens), _temperatures(temperature))
    planned = workload.plan(duration, max_requests=max_requests, seed=seed)
    return await send_workload(targets, planned, duration=duration, model=model, chat=chat, balance=balance,
                               seed=seed, drain_seconds=drain_seconds, max_connections=max_connections,
                               stream=stream, stop=stop, stop_drain_seconds=stop_drain_seconds,
                               prompt_words=prompt_words)


def run_load(targets: Sequence[str], qps: float | str | QpsSchedule, duration: float, **options: object) -> LoadReport:
    """Send Poisson traffic at `qps` (a number or a schedule such as "0-60s:2,60-120s:8") to `targets` for
    `duration` seconds and return what the client measured. Options: max_requests, prompt_tokens and
    output_tokens (Lengths or their text: "256", "100-300", "lognormal:220,0.6"), temperature ("0.7" or
    "0:0.5,1.0:0.5"), chat, model (default: discovered from /v1/models), balance ("round-robin" or
    "random"), seed, drain_seconds (how long to wait for answers after `duration`), max_connections (requests
    under way at once, over all targets; default 1000), stream (False: whole answers, end-to-end latency only),
    stop (a threading.Event that ends the sending early when set), stop_drain_seconds (how long the answers
    under way still get once `stop` is set; default drain_seconds), prompt_words (the words prompts are drawn
    from; default a few English words). Raises TargetUnreachable when no `model` is given and a target does
    not name its model at /v1/models."""
    return asyncio.run(run_load_async(targets, qps, duration, **options))  # type: ignore[arg-type]


def parse_duration(text: str) -> float:
    """"90", "90s", "2m", "1h" -> seconds."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([smh]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"cannot read the duration {text!r}: write 90, 90s, 2m or 1h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeploy-load", description=(
        "Open-loop Poisson load against OpenAI-compatible servers; prints client-side latency percentiles."))
    parser.add_argument("--target", action="append", required=True, metavar="URL",
                        help="base URL of a server (repeat for several; requests are spread over them)")
    parser.add_argument("--qps", default="1", help='requests per second, or a schedule "0-60s:2,60-120s:8"')
    parser.add_argument("--duration", type=parse_duration, default=60.0, help="how long to send (60s, 2m)")
    parser.add_argument("--max-requests", type=int, help="stop sending after this many requests")
    parser.add_argument("--prompt-tokens", default=DEFAULT_PROMPT,
                        help='prompt length: "256", "100-300", "normal:MEAN,SD[,LOW,HIGH]", "lognormal:MEAN,SIGMA[,LOW,HIGH]"')
    parser.add_argument("--output-tokens", default=DEFAULT_OUTPUT, help="output length (max_tokens), same forms")
    parser.add_argument("--temperature", default=DEFAULT_TEMPERATURE, help='"0.7" or a mix "0:0.5,0.7:0.3,1.0:0.2"')
    parser.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    parser.add_argument("--model", help="model name to send (default: the first of each target's /v1/models)")
    parser.add_argument("--balance", choices=("round-robin", "random"), default="round-robin")
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="ask for whole answers (end-to-end latency only; far fewer client events per request)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drain", type=parse_duration, default=60.0, help="wait this long for answers after --duration")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns 0 when every request succeeded, 1 otherwise."""
    options = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        report = run_load(
            options.target, options.qps, options.duration, max_requests=options.max_requests,
            prompt_tokens=options.prompt_tokens, output_tokens=options.output_tokens,
            temperature=options.temperature, chat=options.chat, model=options.model, balance=options.balance,
            seed=options.seed, drain_seconds=options.drain, stream=options.stream,
        )
    except (WorkloadError, ValueError) as error:
        print(f"specdeploy-load: {error}", file=sys.stderr)
        return 2
    except TargetUnreachable as error:
        print(f"specdeploy-load: cannot ask the targets for their model ({error}); check the URLs or pass --model",
              file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=1) if options.json else report.to_text())
    return 0 if report.failed == 0 and report.unfinished == 0 else 1
