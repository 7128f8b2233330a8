"""`python -m specdeploy_engine.sim [options] -- ENGINE ARGV…`: run one simulated engine.

    python -m specdeploy_engine.sim --port 18000 --gpu H100-80GB -- \
        vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config '{"method":"ngram",…}'

Exit status: what the engine would exit with when it refuses the command line (2 for argument errors,
1 for configuration errors), 1 (or the `exitCode` knob) after a simulated CUDA OOM, 0 after SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from specdeploy.planning.gpus import GPU_PRODUCTS, GpuProduct, find_gpu
from specdeploy_engine.sim.argv import EngineArgvError, EngineConfig, parse_engine_argv
from specdeploy_engine.sim.console import startup_lines
from specdeploy_engine.sim.knobs import KnobError, Knobs
from specdeploy_engine.sim.model import ServedModel, served_model
from specdeploy_engine.sim.server import SimServer, crash

DEFAULT_GPU = "H100-80GB"
USAGE = ("python -m specdeploy_engine.sim [--host H] [--port P] [--seed N] [--config-dir DIR] [--gpu PRODUCT] "
         "[--time-scale F] -- ENGINE_COMMAND…")


def _options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeploy-sim", usage=USAGE, description=(
        "Serve the OpenAI API and the engine's Prometheus metrics as the engine of ENGINE_COMMAND would, on "
        "a measured hardware profile instead of a GPU. The simulator's --host and --port win over the engine's."))
    parser.add_argument("--host", help="listen address (default: the engine's --host, else its default)")
    parser.add_argument("--port", type=int, help="listen port (default: the engine's --port, else its default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of acceptance draws and generated text")
    parser.add_argument("--config-dir", type=Path,
                        help="local directory standing in for /etc/specdeploy (the engine ConfigMap's files)")
    parser.add_argument("--gpu", help=f"GPU product ({', '.join(GPU_PRODUCTS)}); default {DEFAULT_GPU}. With "
                        "--gpu the simulator refuses to start a model that does not fit, as the engine would")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiplies every step's duration (0.1: ten times faster than the modelled GPU)")
    return parser


def _gpu(name: str | None, parser: argparse.ArgumentParser) -> GpuProduct:
    gpu = find_gpu(name or DEFAULT_GPU)
    if gpu is None:
        parser.error(f"unknown GPU product {name!r}: use one of {', '.join(GPU_PRODUCTS)}")
    assert gpu is not None
    return gpu


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = _options()
    split = args.index("--") if "--" in args else len(args)
    options = parser.parse_args(args[:split])          # --help exits here
    if split == len(args):
        parser.error("the engine's command line must follow `--`")
    engine_argv = args[split + 1:]
    if options.time_scale <= 0:
        parser.error("--time-scale must be greater than 0")
    gpu = _gpu(options.gpu, parser)
    try:
        knobs = Knobs.from_env(os.environ)
    except KnobError as error:
        print(f"specdeploy-sim: {error}", file=sys.stderr)
        return 2
    try:
        config = parse_engine_argv(engine_argv, config_dir=options.config_dir, gpu=gpu)
    except EngineArgvError as error:
        sys.stderr.write(error.stderr)
        return error.exit_code
    served = served_model(config, gpu)
    host = options.host or config.host
    port = options.port if options.port is not None else config.port
    for line in startup_lines(served, host, port):
        print(line, flush=True)
    if options.gpu and served.startup_error:
        sys.stderr.write(f"ERROR [core.py] EngineCore failed to start.\n{served.startup_error}\n")
        return 1
    if knobs.oom:
        crash(served, knobs.exit_code)
    return asyncio.run(_serve(served, config, knobs, options.seed, options.time_scale, host, port))


async def _serve(served: ServedModel, config: EngineConfig, knobs: Knobs, seed: int, time_scale: float,
                 host: str, port: int) -> int:
    server = SimServer(served, knobs=knobs, seed=seed, time_scale=time_scale)
    try:
        runner = await server.start(host, port)
    except OSError as error:
        print(f"ERROR [api_server.py] cannot listen on {host}:{port}: {error}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    print(f"INFO [launcher] Application startup complete ({config.kind.value} on {host}:{port}).", flush=True)
    await stop.wait()
    await server.stop(runner)
    print("INFO [launcher] Shutting down.", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
