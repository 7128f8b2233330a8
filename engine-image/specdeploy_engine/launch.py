"""`python3 -m specdeploy_engine.launch [--plan PATH] [-- ENGINE COMMAND…]`: the engine image's entrypoint.

    python3 -m specdeploy_engine.launch -- vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000 …
    python3 -m specdeploy_engine.launch        # the engine command from plan.json's "argv"
    python3 -m specdeploy_engine.launch vllm serve …   # `--` may be left out before a command

Reads the plan the operator mounts with the SpeculativeDeployment's ConfigMap (/etc/specdeploy/plan.json),
checks the real free GPU memory against it (preflight.py) and then replaces itself with the engine
(`os.execvp`): the engine keeps the launcher's PID, so it gets the kubelet's SIGTERM itself. With
`SPECDEPLOY_ENGINE=sim` it runs the engine simulator on the same command line instead, so the product
works on clusters without GPUs.

Environment (a command-line option wins over its variable):

    SPECDEPLOY_PLAN             plan.json path (--plan); default /etc/specdeploy/plan.json
    SPECDEPLOY_PREFLIGHT        on (default) | warn (report, start anyway) | off (skip the check)
    SPECDEPLOY_ENGINE           engine (default) | sim
    SPECDEPLOY_SIM_OPTIONS      extra simulator options, shell-quoted, e.g. "--time-scale 0.1 --seed 7"
    SPECDEPLOY_TERMINATION_LOG  where a refusal is also written (--termination-log); default
                                /dev/termination-log, which `kubectl describe pod` shows

Exit status (only when the engine was not started): 2 the launcher cannot run (no command, plan.json
missing or invalid, a bad setting), 3 the preflight refused, 126 the engine command cannot be executed,
127 it is not installed in the image.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from specdeploy_engine import preflight
from specdeploy_engine.preflight import GpuMemory, GpuUnavailable, LaunchPlan, PlanError

CONFIG_DIR = Path("/etc/specdeploy")     # specdeploy.engines.CONFIG_MOUNT_PATH (a test keeps them equal)
PLAN_FILE = "plan.json"                  # specdeploy.reconcile.children.PLAN_FILE
DEFAULT_PLAN = CONFIG_DIR / PLAN_FILE
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
TERMINATION_MESSAGE_BYTES = 4096
"""Kubernetes keeps at most 4096 bytes of a container's termination message ("Determine the Reason for
Pod Failure", kubernetes.io); the launcher puts the most important lines first."""
SIM_MODULE = "specdeploy_engine.sim"
SIM_HOST = "0.0.0.0"

EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class LaunchFailure(Exception):
    """The engine will not be started: `message` says why and what to do, `exit_code` is the status.

    LaunchFailure          exit 2: no command, plan.json missing or invalid, a bad setting
     └── Refused           exit 3: the preflight found GPU memory that cannot hold the plan
    """

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Refused(LaunchFailure):
    exit_code = EXIT_REFUSED


class Preflight(StrEnum):
    ON = "on"
    WARN = "warn"
    OFF = "off"


class Mode(StrEnum):
    ENGINE = "engine"
    SIM = "sim"


@dataclass(frozen=True)
class Settings:
    """The launcher's inputs from its command line and environment."""

    plan_path: Path
    preflight: Preflight
    mode: Mode
    termination_log: Path
    sim_options: tuple[str, ...]
    argv: tuple[str, ...] | None         # the engine command after `--`; None: take plan.json's

    @property
    def config_dir(self) -> Path:
        """The directory holding plan.json and the engine's other config files (trtllm.yaml)."""
        return self.plan_path.parent


def _choice(environ: Mapping[str, str], name: str, enum: type[Preflight] | type[Mode]) -> str:
    value = environ.get(name, "").strip().lower()
    allowed = [member.value for member in enum]
    if value and value not in allowed:
        raise LaunchFailure(f"{name}={environ[name]!r} is not one of {', '.join(allowed)}")
    return value or allowed[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m specdeploy_engine.launch",
        usage="python3 -m specdeploy_engine.launch [--plan PATH] [--termination-log PATH] [-- ENGINE COMMAND…]",
        description="Check GPU memory against the SpeculativeDeployment's plan, then exec the engine "
                    "(or its simulator with SPECDEPLOY_ENGINE=sim).")
    parser.add_argument("--plan", type=Path, help=f"plan.json (default $SPECDEPLOY_PLAN or {DEFAULT_PLAN})")
    parser.add_argument("--termination-log", type=Path,
                        help=f"file a refusal is written to (default $SPECDEPLOY_TERMINATION_LOG or "
                             f"{DEFAULT_TERMINATION_LOG})")
    return parser


_VALUE_OPTIONS = ("--plan", "--termination-log")


def split_arguments(argv: Sequence[str]) -> tuple[list[str], tuple[str, ...] | None]:
    """The launcher's own options, and the engine command: what follows `--`, or from the first word that is
    not an option (so `launch vllm serve …`, an image ENTRYPOINT plus the pod's args, works too)."""
    words = list(argv)
    position = 0
    while position < len(words):
        word = words[position]
        if word == "--":
            return words[:position], tuple(words[position + 1:])
        if not word.startswith("-"):
            return words[:position], tuple(words[position:])
        position += 2 if word in _VALUE_OPTIONS else 1
    return words, None


def settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Settings from the launcher's arguments (options, then the engine command) and environment."""
    args, engine_argv = split_arguments(argv)
    if engine_argv is not None and not engine_argv:
        raise LaunchFailure("nothing follows `--`: give the engine command after it, or leave `--` out to "
                            "run plan.json's argv")
    options, rest = _parser().parse_known_args(args)
    if rest:
        raise LaunchFailure(f"unexpected arguments {' '.join(rest)!r}: the engine command goes after `--`")
    plan_path = options.plan or Path(environ.get("SPECDEPLOY_PLAN") or DEFAULT_PLAN)
    log_path = options.termination_log or Path(environ.get("SPECDEPLOY_TERMINATION_LOG") or DEFAULT_TERMINATION_LOG)
    try:
        sim_options = tuple(shlex.split(environ.get("SPECDEPLOY_SIM_OPTIONS", "")))
    except ValueError as error:
        raise LaunchFailure(f"SPECDEPLOY_SIM_OPTIONS is not valid shell quoting: {error}") from error
    return Settings(
        plan_path=plan_path,
        preflight=Preflight(_choice(environ, "SPECDEPLOY_PREFLIGHT", Preflight)),
        mode=Mode(_choice(environ, "SPECDEPLOY_ENGINE", Mode)),
        termination_log=log_path,
        sim_options=sim_options,
        argv=engine_argv,
    )


def load_plan(path: Path) -> LaunchPlan:
    """plan.json at `path`; LaunchFailure naming the file and the problem when it is missing or invalid."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise LaunchFailure(
            f"plan file {path} does not exist: mount the SpeculativeDeployment's ConfigMap at {path.parent} "
            f"(the operator does), or point --plan / SPECDEPLOY_PLAN at the file") from error
    except OSError as error:
        raise LaunchFailure(f"cannot read plan file {path}: {error.strerror or error}") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise LaunchFailure(f"plan file {path} is not valid JSON: {error.msg} at line {error.lineno} "
                            f"column {error.colno}") from error
    try:
        return preflight.launch_plan(data)
    except PlanError as error:
        raise LaunchFailure(f"{path}: {error}") from error


def sim_command(engine_argv: Sequence[str], config_dir: Path, options: Sequence[str],
                python: str | None = None) -> list[str]:
    """The simulator's command line for `engine_argv`: listening where the engine would, reading its config."""
    command = [python or sys.executable, "-m", SIM_MODULE, "--host", SIM_HOST]
    port = preflight.engine_args(engine_argv).port
    if port is not None:
        command += ["--port", str(port)]
    return [*command, "--config-dir", str(config_dir), *options, "--", *engine_argv]


def _warn(message: str) -> None:
    print(f"specdeploy-launch: {message}", file=sys.stderr)


def _check_gpus(plan: LaunchPlan, mode: Preflight, read_gpus: Callable[[], list[GpuMemory]]) -> None:
    """Run the preflight; Refused when it fails and `mode` is on, a warning on stderr when warn."""
    engine = plan.engine_args
    try:
        gpus = read_gpus()
    except GpuUnavailable as error:
        message = (f"specdeploy preflight cannot read GPU memory: {error}. {engine.engine} needs {engine.gpus} "
                   "GPU(s). On a node without GPUs set SPECDEPLOY_ENGINE=sim to run the simulator; "
                   "SPECDEPLOY_PREFLIGHT=warn starts the engine anyway.")
        if mode == Preflight.ON:
            raise Refused(message) from error
        _warn(f"warning: {message}")
        return
    result = preflight.check(plan, gpus)
    if result.ok:
        print(result.report(), file=sys.stderr)
    elif mode == Preflight.ON:
        raise Refused(result.report())
    else:
        _warn("warning (SPECDEPLOY_PREFLIGHT=warn, starting anyway):\n" + result.report())


def command_to_run(settings: Settings, read_gpus: Callable[[], list[GpuMemory]] | None = None) -> list[str]:
    """The command to exec: the engine's after a passing preflight, or the simulator's.

    Raises LaunchFailure (or its Refused) with the message to print when nothing should start.
    """
    needs_plan = settings.argv is None or (settings.mode == Mode.ENGINE and settings.preflight != Preflight.OFF)
    plan: LaunchPlan | None = None
    if needs_plan:
        try:
            plan = load_plan(settings.plan_path)
        except LaunchFailure as failure:
            if settings.argv is None or settings.preflight == Preflight.ON:
                if settings.argv is not None:
                    failure.message += "; without it the GPU preflight cannot run (SPECDEPLOY_PREFLIGHT=off skips it)"
                raise
            _warn(f"warning: {failure.message}; starting without the GPU preflight (SPECDEPLOY_PREFLIGHT=warn)")
    engine_argv = settings.argv
    if engine_argv is None:
        assert plan is not None
        if not plan.argv:
            raise LaunchFailure(f"{settings.plan_path} has an empty `argv` and no engine command follows `--`")
        engine_argv = plan.argv
    elif plan is not None and plan.argv and plan.argv != engine_argv:
        _warn(f"note: the command line differs from {settings.plan_path}'s argv; running the command line")
    if settings.mode == Mode.SIM:
        return sim_command(engine_argv, settings.config_dir, settings.sim_options)
    if plan is not None and settings.preflight != Preflight.OFF:
        _check_gpus(replace(plan, argv=engine_argv), settings.preflight, read_gpus or preflight.read_gpus)
    return list(engine_argv)


def write_termination_log(path: Path, message: str) -> None:
    """Leave `message` where Kubernetes reads a container's termination message.

    The default /dev/termination-log is written only when it exists (the kubelet creates it), so a run
    outside Kubernetes does not create files under /dev; a path given explicitly is always written.
    """
    if path == DEFAULT_TERMINATION_LOG and not path.exists():
        return
    data = message.encode("utf-8")[:TERMINATION_MESSAGE_BYTES]
    try:
        path.write_bytes(data.decode("utf-8", errors="ignore").encode("utf-8"))
    except OSError as error:
        _warn(f"cannot write the termination message to {path}: {error.strerror or error}")


def exec_command(command: Sequence[str]) -> int:
    """Replace this process with `command`; returns only when it cannot be started (126 or 127)."""
    _warn("exec " + shlex.join(command))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], list(command))
    except FileNotFoundError:
        _warn(f"the engine command {command[0]!r} is not installed in this image (PATH={os.environ.get('PATH', '')}): "
              "use the engine's image for `spec.engine.kind`")
        return EXIT_NOT_FOUND
    except OSError as error:
        _warn(f"cannot execute {command[0]!r}: {error.strerror or error}")
        return EXIT_NOT_EXECUTABLE
    return EXIT_NOT_EXECUTABLE  # os.execvp returns only by raising; kept for the type checker


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environment = os.environ if environ is None else environ
    log_path = Path(environment.get("SPECDEPLOY_TERMINATION_LOG") or DEFAULT_TERMINATION_LOG)
    try:
        launch_settings = settings(sys.argv[1:] if argv is None else argv, environment)
        log_path = launch_settings.termination_log
        command = command_to_run(launch_settings)
    except LaunchFailure as failure:
        message = failure.message if isinstance(failure, Refused) else f"specdeploy-launch: {failure.message}"
        print(message, file=sys.stderr)
        write_termination_log(log_path, message)
        return failure.exit_code
    return exec_command(command)


if __name__ == "__main__":
    raise SystemExit(main())
