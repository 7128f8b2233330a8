"""Run a `vllm serve` of the CPU build on the stand-in models on loopback, outside a cluster, for tests and
benchmarks: the command line, the environment, the log, the wait for /health, and the stop.

A stand-in server starts from the command line a pod would run (`vllm serve MODEL …`), translated for this
machine by the dev cluster's own translations (vllm_pods.cpu_serve: stand-in target and draft, no GPU flags,
the loopback port), so what runs is what an engine pod of the dev cluster runs; an EAGLE or EAGLE-3 draft runs
as the stand-in head of its method. Any other local server that answers GET /health (the simulator, run beside it for comparison) starts the same way with `local_server`.

Usage::

    with standin_vllm(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "512"],
                      log=tmp / "vllm.log") as server:
        httpx.get(f"{server.base_url}/metrics"); server.ready_s; server.pid   # pid: also its process group
    with local_server("simulator", [sys.executable, "-m", "specdeploy_engine.sim", "--port", str(port), ...],
                      log=tmp / "sim.log", port=port, timeout=60) as sim:
        ...

Exceptions: ProcessFailed when the server exits before /health answers or is not healthy by the deadline
(the message names the log and ends with its last lines).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from specdeploy.devcluster import processes
from specdeploy.devcluster.errors import ProcessFailed
from specdeploy.devcluster.vllm_env import cpu_environment, ensure_real_vllm
from specdeploy.devcluster.vllm_pods import LOOPBACK, RealVllm, cpu_serve
from specdeploy.devcluster.wait import WaitTimeout, wait_for

#: Variables of the operator's Python that would point vLLM's own Python at the operator's packages.
OPERATOR_PYTHON_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
#: Seconds a real CPU vLLM may take to answer /health: a minute or two alone, several beside other servers.
VLLM_START_SECONDS = 600.0
#: Seconds between SIGTERM and SIGKILL of a server's process group: vLLM stops its engine core first.
STOP_GRACE_SECONDS = 20.0


@dataclass(frozen=True)
class LocalServer:
    """A server this process started on loopback, healthy: its pid (its process group and session too), port,
    argv, log, and the seconds from its start until /health answered."""

    name: str
    pid: int
    port: int
    argv: tuple[str, ...]
    log: Path
    ready_s: float

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def serve_environment(real: RealVllm, pod_env: Mapping[str, str] | None = None,
                      host: Mapping[str, str] | None = None) -> dict[str, str]:
    """A `vllm serve` process's environment: `host` (default: this process's) without OPERATOR_PYTHON_ENV, the
    pod's own `pod_env` over it, then the CPU settings (vllm_env.cpu_environment) and unbuffered output."""
    base = {k: v for k, v in (os.environ if host is None else host).items() if k not in OPERATOR_PYTHON_ENV}
    return {**base, **(pod_env or {}), **cpu_environment(real.kv_cache_gib, real.threads), "PYTHONUNBUFFERED": "1"}


def wait_healthy(name: str, pid: int, url: str, log: Path, timeout: float) -> float:
    """Seconds until GET `url` answers 200; ProcessFailed (with the log's tail) when process `pid` exits first
    or `timeout` passes."""
    def healthy() -> bool:
        if not processes.alive(pid):
            raise processes.failure(name, log, "exited before it answered /health")
        return httpx.get(url, timeout=2.0).status_code == 200

    began = time.monotonic()
    try:
        wait_for(healthy, timeout, f"{name} answering {url}", interval=0.5, fatal=(ProcessFailed,))
    except WaitTimeout as exc:
        raise processes.failure(name, log, f"was not healthy in time ({exc})") from exc
    return time.monotonic() - began


@contextmanager
def local_server(name: str, argv: Sequence[str], log: Path, port: int, env: Mapping[str, str] | None = None,
                 timeout: float = 60.0, health_path: str = "/health",
                 grace: float = STOP_GRACE_SECONDS) -> Iterator[LocalServer]:
    """`argv` (which listens on 127.0.0.1:`port`) in a process group of its own, output appended to `log`;
    yields once `health_path` answers 200, and stops the whole group however the block ends (SIGTERM, SIGKILL
    after `grace` seconds)."""
    pid = processes.start(name, argv, log, env=env)
    try:
        ready_s = wait_healthy(name, pid, f"http://{LOOPBACK}:{port}{health_path}", log, timeout)
        yield LocalServer(name, pid, port, tuple(argv), log, ready_s)
    finally:
        processes.stop(pid, grace=grace)


@contextmanager
def standin_vllm(argv: Sequence[str], log: Path, real: RealVllm | None = None, port: int | None = None,
                 timeout: float = VLLM_START_SECONDS) -> Iterator[LocalServer]:
    """The pod command line `argv` (`vllm serve MODEL …`) run by the CPU build on the stand-ins: translated by
    vllm_pods.cpu_serve onto `port` (default: a free one), in serve_environment, the translations written at the
    top of `log` as the pod runner writes them. `real` defaults to vllm_env.ensure_real_vllm() (installs the CPU
    build on first use)."""
    real = real or ensure_real_vllm()
    port = port or processes.free_port()
    serve = cpu_serve(argv, vllm=real.vllm, port=port, standins=real.standins)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(serve.log_header)
    with local_server("vllm serve", serve.argv, log, port, env=serve_environment(real), timeout=timeout) as server:
        yield server
