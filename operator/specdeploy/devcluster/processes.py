"""Start, watch and stop the component processes, each in its own process group with its own log.

Why process groups and pid files: `down` may run in another Python process than `up` (the CLI), so
everything needed to stop a component is on disk — its pid, which is also its process-group id.
Processes this Python process started are also reaped here, so no zombie outlives `down`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from specdeploy.devcluster.errors import ProcessFailed

# Popen handles of the children this interpreter started, so `stop` can reap them (no zombies, no
# "still running" ResourceWarning when the handle is garbage-collected).
_children: dict[int, subprocess.Popen[bytes]] = {}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different TCP ports on 127.0.0.1 that nothing listens on right now. All are held open until all
    are chosen: one at a time, the kernel may hand out a port it just handed out (Prometheus and Alertmanager
    of one dev cluster were once given the same one, and Prometheus could not start)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def start(name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> int:
    """Start `argv` in a new session (its pid is its process-group id), output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        handle.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}: {' '.join(argv)}\n".encode())
        handle.flush()
        try:
            proc = subprocess.Popen(list(argv), stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=dict(env) if env is not None else None, cwd=cwd)
        except OSError as exc:
            raise ProcessFailed(f"could not start {name} ({argv[0]}): {exc}") from exc
    _children[proc.pid] = proc
    return proc.pid


def alive(pid: int) -> bool:
    """Whether `pid` is a running (not zombie) process; reaps it when it is our exited child."""
    proc = _children.get(pid)
    if proc is not None:
        if proc.poll() is None:
            return True
        _children.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Pids of live processes in process group `pgid` (children a component forked count too)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), to tell a recorded pid from a reused one."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def stop(pid: int, grace: float = 10.0, started: int | None = None) -> None:
    """SIGTERM the process group `pid` leads, SIGKILL what is left after `grace` seconds, reap.

    With `started` (from `start_ticks`), a pid that now belongs to a different process is left alone.
    """
    stop_all([(pid, started)], grace)


def stop_all(targets: Sequence[tuple[int, int | None]], grace: float = 10.0) -> None:
    """`stop` for several process groups at once: all get SIGTERM together, then SIGKILL together."""
    groups = [pid for pid, started in targets
              if started is None or not alive(pid) or start_ticks(pid) == started]

    def running() -> list[int]:
        return [pid for pid in groups if alive(pid) or group_members(pid)]

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in running():
            _signal_group(pid, sig)
        deadline = time.monotonic() + wait
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
    for pid in groups:
        proc = _children.pop(pid, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
    if left := running():
        raise ProcessFailed(f"process groups {left} survived SIGKILL; stop them by hand (kill -9 -PGID)")


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def log_tail(log: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log file, for error messages."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def failure(name: str, log: Path, why: str) -> ProcessFailed:
    """A ProcessFailed that names the component, its log file and the log's last lines."""
    return ProcessFailed(f"{name} {why}; log: {log}\n--- last lines of {log.name} ---\n{log_tail(log)}")
