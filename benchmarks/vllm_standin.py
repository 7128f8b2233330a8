"""Real vLLM (CPU build) serving the stand-in models: start time, CPU per request, acceptance per prompt half.

Starts `vllm serve <target stand-in>` on 127.0.0.1 with a speculative method (specdeploy.devcluster.vllm_serve:
the dev cluster's translations and environment), sends a fixed number of greedy completions whose prompts come
from the predictable half of the words, then as many from the unpredictable half (see
specdeploy.devcluster.standins), reads the spec-decode counters from /metrics after each half, and stops the
server (its whole process group) however the run ends. CPU is user + system time of the server and every process
it started.

    python benchmarks/vllm_standin.py                       # draft_model, k = 3
    python benchmarks/vllm_standin.py --method ngram          # also eagle, eagle3 (the stand-in heads), none
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import httpx
from process_usage import cpu_seconds, load_average, machine
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.devcluster import standins, vllm_env
from specdeploy.devcluster.errors import ProcessFailed
from specdeploy.devcluster.vllm_serve import standin_vllm

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
HISTOGRAMS = ("vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:time_to_first_token_seconds")
START_DEADLINE_S = 900.0
SERVED_NAME = "standin"


def speculative_config(method: str, k: int, draft: Path) -> dict[str, object] | None:
    if method in ("draft_model", "eagle", "eagle3"):   # an eagle/eagle3 draft runs as that method's stand-in head
        return {"method": method, "model": str(draft), "num_speculative_tokens": k}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    return None


def session_cpu_seconds(session: int) -> float:
    """CPU seconds of every live process in session `session` (the server and its engine core)."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.getsid(int(proc.name)) == session:
                    total += cpu_seconds(int(proc.name))
            except (ProcessLookupError, PermissionError, FileNotFoundError):
                continue
    return total


def spec_counts(text: str) -> dict[str, float]:
    """The spec-decode counters (summed over labels) and accepted tokens per position, by name."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.removesuffix("_total") in SPEC_COUNTERS and sample.name.endswith("_total"):
                counts[sample.name] = counts.get(sample.name, 0.0) + sample.value
            elif sample.name == f"{PER_POSITION}_total":
                key = f"{sample.name}{{position={sample.labels.get('position')}}}"
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def describe_families(text: str) -> list[str]:
    """Type, label names and bucket boundaries of the families the analysis reads, and whether each has a
    `_created` series."""
    lines: list[str] = []
    families = {f.name: f for f in text_string_to_metric_families(text)}
    wanted = [*SPEC_COUNTERS, PER_POSITION, *HISTOGRAMS]
    for name in wanted:
        family = families.get(name)
        if family is None:
            lines.append(f"  {name:<52} absent")
            continue
        labels = sorted({k for s in family.samples for k in s.labels if k not in ("le", "position")})
        extra = sorted({k for s in family.samples for k in s.labels if k == "position"})
        # prometheus_client exposes each creation time as a gauge family of its own, `<base>_created`
        created = f"{name}_created" in families
        lines.append(f"  {name:<52} {family.type:<9} labels={labels + extra} _created={created}")
        if family.type == "histogram":
            bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
            lines.append(f"    buckets: {', '.join(f'{b:g}' for b in bounds)}")
    return lines


def prompts(method: str, half: standins.Half, count: int) -> list[str]:
    """Random words of the half; for ngram's predictable half, walks of the target's cycle that repeat their
    start, since ngram drafts only what it finds earlier in the text."""
    if method == "ngram" and half == standins.PREDICTABLE:
        return [" ".join(standins.repeating_prompt_words(half, length=30, seed=i)) for i in range(count)]
    return [" ".join(standins.prompt_words(half, length=8, seed=i)) for i in range(count)]


def run_half(client: httpx.Client, prompt_texts: list[str], max_tokens: int) -> list[str]:
    texts: list[str] = []
    for prompt in prompt_texts:
        reply = client.post("/v1/completions", json={"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                                     "temperature": 0.0, "ignore_eos": True})
        reply.raise_for_status()
        texts.append(reply.json()["choices"][0]["text"])
    return texts


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: value - before.get(name, 0.0) for name, value in sorted(after.items())}


def main(method: str, k: int, requests: int, max_tokens: int, kv_cache_gib: int, threads: int) -> None:
    print(machine())
    print(f"load average before: {load_average()}")
    real = replace(vllm_env.ensure_real_vllm(progress=print), kv_cache_gib=kv_cache_gib, threads=threads)
    command = ["vllm", "serve", str(real.standins.target), "--served-model-name", SERVED_NAME,
               "--load-format", "safetensors", "--max-model-len", "512", "--max-num-seqs", "4", "--dtype", "float32"]
    config = speculative_config(method, k, real.standins.draft)
    if config is not None:
        command += ["--speculative-config", json.dumps(config)]
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-standin-{method}-{os.getpid()}.log"
    print(f"starting {' '.join(command)}\n  log: {log}")
    try:
        with standin_vllm(command, log, real, timeout=START_DEADLINE_S) as server:
            print(f"$ {' '.join(server.argv)}")
            print(f"start time: {server.ready_s:.1f} s (until /health answers)")
            measure(server.base_url, server.pid, method, requests, max_tokens)
    except ProcessFailed as exc:
        raise SystemExit(str(exc)) from exc
    print(f"load average after: {load_average()}")


def measure(base: str, session: int, method: str, requests: int, max_tokens: int) -> None:
    """Each half's requests, CPU and spec-decode counters, then the families the analysis reads."""
    with httpx.Client(base_url=base, timeout=120) as client:
        before = spec_counts(client.get("/metrics").text)
        for half in (standins.PREDICTABLE, standins.UNPREDICTABLE):
            cpu_before, wall_before = session_cpu_seconds(session), time.monotonic()
            texts = run_half(client, prompts(method, half, requests), max_tokens)
            cpu_used = session_cpu_seconds(session) - cpu_before
            wall = time.monotonic() - wall_before
            scraped = client.get("/metrics").text
            after = spec_counts(scraped)
            print(f"{half} half: {requests} requests × {max_tokens} tokens, "
                  f"CPU {cpu_used / requests:.2f} s/request, wall {wall / requests:.2f} s/request")
            print(f"  first reply: {texts[0][:80]!r}")
            for name, value in delta(after, before).items():
                print(f"  {name:<64} {value:g}")
            before = after
        print("families:")
        print("\n".join(describe_families(scraped)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--method", choices=("draft_model", "eagle", "eagle3", "ngram", "none"), default="draft_model")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--requests", type=int, default=6, help="requests per prompt half")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    main(args.method, args.k, args.requests, args.max_tokens, args.kv_cache_gib, args.threads)
