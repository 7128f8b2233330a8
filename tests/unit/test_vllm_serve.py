"""paths.cache_dir and devcluster/vllm_serve: where the cache is, a server's environment, and a local server
started, awaited on /health and stopped (with a few-line Python server in place of vLLM)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from specdeploy.devcluster import processes
from specdeploy.devcluster.errors import ProcessFailed
from specdeploy.devcluster.vllm_pods import RealVllm, Standins
from specdeploy.devcluster.vllm_serve import (
    OPERATOR_PYTHON_ENV,
    local_server,
    serve_environment,
    standin_vllm,
)
from specdeploy.paths import cache_dir

#: Answers 200 on /health after `delay` seconds (argv[2]) on port argv[1]; 404 elsewhere.
HEALTH_SERVER = """
import http.server, os, sys, time
print("pid", os.getpid(), flush=True)
ready = time.monotonic() + float(sys.argv[2])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" and time.monotonic() >= ready else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_cache_dir_the_variable_then_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECDEPLOY_CACHE_DIR", str(tmp_path / "here"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "here"
    monkeypatch.delenv("SPECDEPLOY_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "specdeploy"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "specdeploy"


def test_serve_environment_drops_the_operators_python_and_lays_the_cpu_settings_over_the_pods() -> None:
    real = RealVllm(Path("/env/bin/vllm"), Standins(Path("/t"), Path("/d"), 2048), kv_cache_gib=2, threads=1)
    host = {"PATH": "/bin", "PYTHONPATH": "/operator", "VIRTUAL_ENV": "/operator/.venv", "OMP_NUM_THREADS": "8"}
    env = serve_environment(real, pod_env={"OMP_NUM_THREADS": "4", "FROM_POD": "1"}, host=host)
    assert not set(OPERATOR_PYTHON_ENV) & set(env)
    assert env["PATH"] == "/bin" and env["FROM_POD"] == "1"
    assert env["OMP_NUM_THREADS"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"   # the CPU settings win
    assert env["PYTHONUNBUFFERED"] == "1"


def test_local_server_yields_once_healthy_and_stops_its_process_group(tmp_path: Path) -> None:
    port = processes.free_port()
    argv = [sys.executable, "-c", HEALTH_SERVER, str(port), "0.5"]
    with local_server("health", argv, tmp_path / "health.log", port, timeout=30) as server:
        assert server.ready_s >= 0.4
        assert httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200
        pid = server.pid
    assert not processes.alive(pid) and not processes.group_members(pid)


def test_local_server_that_exits_first_fails_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    with (pytest.raises(ProcessFailed, match=r"(?s)exited before it answered /health.*no model here"),
          local_server("broken", argv, tmp_path / "broken.log", processes.free_port(), timeout=30)):
        pytest.fail("a server that exited was yielded")


def test_local_server_not_healthy_in_time_is_stopped(tmp_path: Path) -> None:
    port = processes.free_port()
    argv = [sys.executable, "-c", HEALTH_SERVER, str(port), "600"]
    with (pytest.raises(ProcessFailed, match="was not healthy in time"),
          local_server("slow", argv, tmp_path / "slow.log", port, timeout=1.5, grace=5)):
        pytest.fail("a server that never answered was yielded")
    [pid] = [int(line.split()[1]) for line in (tmp_path / "slow.log").read_text().splitlines()
             if line.startswith("pid ")]
    assert not processes.alive(pid) and not processes.group_members(pid)


def test_standin_vllm_runs_the_translated_command_line_in_the_cpu_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `vllm` (the health server, reading --port) shows the argv and environment it was given."""
    monkeypatch.setenv("VIRTUAL_ENV", "/operator/.venv")
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport os, sys\nprint('argv', *sys.argv[1:])\n"
                    "print('threads', os.environ.get('OMP_NUM_THREADS'), 'venv', os.environ.get('VIRTUAL_ENV'))\n"
                    f"sys.argv = [sys.argv[0], sys.argv[sys.argv.index('--port') + 1], '0']\n{HEALTH_SERVER}")
    fake.chmod(0o755)
    real = RealVllm(fake, Standins(tmp_path / "target", tmp_path / "draft", 2048))
    argv = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-utilization", "0.9", "--port", "8000"]
    log = tmp_path / "vllm.log"
    with standin_vllm(argv, log, real, timeout=30) as server:
        assert httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200
        assert server.argv[:3] == (str(fake), "serve", str(tmp_path / "target"))
    text = log.read_text()
    assert text.startswith("specdeploy dev-cluster: model meta-llama/Llama-3.1-8B-Instruct -> stand-in")
    assert "--gpu-memory-utilization" not in text.split("argv", 1)[1]
    assert f"--port {server.port}" in text and "threads 1 venv None" in text
