"""Shared by the simulator's tests: a SimServer on loopback for a pod's command line, and an engine run to its end."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.engine import Engine
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.model import served_model
from specdeploy_engine.sim.server import SimServer

SCALE = 0.2   # five times faster than the modelled H100: requests of a few dozen tokens take milliseconds


@contextlib.asynccontextmanager
async def simulator_on_loopback(argv: list[str], knobs: Knobs | None = None, config_dir: Path | None = None,
                                seed: int = 1, time_scale: float = SCALE) -> AsyncIterator[str]:
    """The simulator of `argv` on an H100 at 127.0.0.1 and a free port; its base URL."""
    gpu = find_gpu("H100-80GB")
    assert gpu is not None
    server = SimServer(served_model(parse_engine_argv(argv, config_dir=config_dir, gpu=gpu), gpu),
                       knobs=knobs or Knobs(), seed=seed, time_scale=time_scale)
    runner = await server.start("127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await server.stop(runner)


def run_to_end(engine: Engine) -> None:
    """Step `engine` on simulated time until it has nothing left to do."""
    now = 0.0
    while engine.has_work:
        step = engine.plan_step(now)
        assert step is not None
        now += step.seconds
        engine.complete_step(step, now)
