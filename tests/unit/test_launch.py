"""The engine image's launcher: settings, plan.json, preflight outcome, exec of the engine or simulator; the
Dockerfiles' structure."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.spec import EngineKind
from specdeploy.engines import CONFIG_MOUNT_PATH, DEFAULT_IMAGES
from specdeploy.reconcile.children import PLAN_FILE
from specdeploy_engine import launch, preflight
from specdeploy_engine.launch import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_USAGE,
    LaunchFailure,
    Mode,
    Preflight,
    main,
    settings,
    sim_command,
    split_arguments,
    write_termination_log,
)
from specdeploy_engine.preflight import GIB, GpuMemory, GpuUnavailable

ROOT = Path(__file__).resolve().parents[2]
H100_TOTAL = int(79.19 * GIB)
ARGV = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--tensor-parallel-size", "1",
        "--max-model-len", "8192", "--gpu-memory-utilization", "0.9"]
PLAN = {
    "memoryPlan": {
        "perGpu": {"budgetGiB": 71.271, "targetWeightsGiB": 14.958, "draftWeightsGiB": 0.0, "overheadGiB": 1.9,
                   "kvCacheGiB": 54.413},
        "kvBytesPerToken": 131072, "kvCacheTokens": 445744, "maxModelLen": 8192,
    },
    "argv": ARGV,
}


class Execed(Exception):
    """Raised by the fake os.execvp in place of replacing the test process."""

    def __init__(self, file: str, args: list[str]) -> None:
        super().__init__(file)
        self.file, self.argv = file, args


@pytest.fixture
def execvp(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(file: str, args: list[str]) -> None:
        raise Execed(file, list(args))
    monkeypatch.setattr(os, "execvp", fake)


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "specdeploy" / PLAN_FILE
    path.parent.mkdir()
    path.write_text(json.dumps(PLAN))
    return path


def _gpus(free_gib: float) -> Callable[[], list[GpuMemory]]:
    def read() -> list[GpuMemory]:
        return [GpuMemory(0, int(free_gib * GIB), H100_TOTAL, "NVIDIA H100 80GB HBM3")]
    return read


def _env(tmp_path: Path, **values: str) -> dict[str, str]:
    return {"SPECDEPLOY_TERMINATION_LOG": str(tmp_path / "termination-log"), **values}


def _run(argv: list[str], env: dict[str, str]) -> Execed:
    with pytest.raises(Execed) as execed:
        main(argv, env)
    return execed.value


# ------------------------------------------------------------------------------------------ settings


def test_constants_match_the_operator() -> None:
    assert str(launch.CONFIG_DIR) == CONFIG_MOUNT_PATH
    assert launch.PLAN_FILE == PLAN_FILE


@pytest.mark.parametrize(("argv", "options", "engine"), [
    (["--", *ARGV], [], tuple(ARGV)),
    (["--plan", "/p.json", "--", *ARGV], ["--plan", "/p.json"], tuple(ARGV)),
    (ARGV, [], tuple(ARGV)),                                   # ENTRYPOINT + the pod's args, no `--`
    (["python3", "-m", "sglang.launch_server", "--port", "1"], [],
     ("python3", "-m", "sglang.launch_server", "--port", "1")),
    (["--plan", "vllm", *ARGV], ["--plan", "vllm"], tuple(ARGV)),   # an option's value is not the command
    (["--plan=/p.json"], ["--plan=/p.json"], None),
    ([], [], None),
])
def test_split_arguments(argv: list[str], options: list[str], engine: tuple[str, ...] | None) -> None:
    assert split_arguments(argv) == (options, engine)


def test_settings_defaults() -> None:
    launch_settings = settings(["--", *ARGV], {})
    assert launch_settings.plan_path == Path("/etc/specdeploy/plan.json")
    assert launch_settings.config_dir == Path("/etc/specdeploy")
    assert launch_settings.termination_log == Path("/dev/termination-log")
    assert (launch_settings.preflight, launch_settings.mode) == (Preflight.ON, Mode.ENGINE)
    assert launch_settings.argv == tuple(ARGV)


def test_environment_sets_and_options_win() -> None:
    env = {"SPECDEPLOY_PLAN": "/env/plan.json", "SPECDEPLOY_PREFLIGHT": "WARN", "SPECDEPLOY_ENGINE": "sim",
           "SPECDEPLOY_SIM_OPTIONS": "--time-scale 0.1 --seed '7'", "SPECDEPLOY_TERMINATION_LOG": "/env/log"}
    from_env = settings([], env)
    assert (from_env.plan_path, from_env.termination_log) == (Path("/env/plan.json"), Path("/env/log"))
    assert (from_env.preflight, from_env.mode) == (Preflight.WARN, Mode.SIM)
    assert from_env.sim_options == ("--time-scale", "0.1", "--seed", "7")
    from_options = settings(["--plan", "/cli/plan.json", "--termination-log", "/cli/log"], env)
    assert (from_options.plan_path, from_options.termination_log) == (Path("/cli/plan.json"), Path("/cli/log"))


@pytest.mark.parametrize(("argv", "env", "message"), [
    ([], {"SPECDEPLOY_PREFLIGHT": "maybe"}, "SPECDEPLOY_PREFLIGHT='maybe' is not one of on, warn, off"),
    ([], {"SPECDEPLOY_ENGINE": "real"}, "SPECDEPLOY_ENGINE='real' is not one of engine, sim"),
    ([], {"SPECDEPLOY_SIM_OPTIONS": "--seed '7"}, "not valid shell quoting"),
    (["--"], {}, "nothing follows `--`"),
    (["--bogus", "--", *ARGV], {}, "unexpected arguments '--bogus'"),
])
def test_bad_settings_fail_with_exit_2(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchFailure, match=re.escape(message)) as failure:
        settings(argv, env)
    assert failure.value.exit_code == EXIT_USAGE


# ------------------------------------------------------------------------------------------ engine mode


def test_fitting_gpu_execs_the_engine_command(execvp: None, plan_file: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(preflight, "read_gpus", _gpus(78.6))
    execed = _run(["--plan", str(plan_file), "--", *ARGV], _env(tmp_path))
    assert (execed.file, execed.argv) == ("vllm", ARGV)
    err = capsys.readouterr().err
    assert "the GPU memory holds the plan; starting vllm" in err
    assert "exec vllm serve meta-llama/Llama-3.1-8B-Instruct" in err
    assert not (tmp_path / "termination-log").exists()


def test_without_arguments_the_command_comes_from_plan_json(execvp: None, plan_file: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "read_gpus", _gpus(78.6))
    execed = _run([], _env(tmp_path, SPECDEPLOY_PLAN=str(plan_file)))
    assert execed.argv == ARGV


def test_refusal_exits_3_with_the_numbers_on_stderr_and_in_the_termination_log(
        execvp: None, plan_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(preflight, "read_gpus", _gpus(40.0))
    assert main(["--plan", str(plan_file), "--", *ARGV], _env(tmp_path)) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert err.startswith("specdeploy preflight refused to start vllm: GPU 0 cannot hold the memory plan.")
    assert "the plan needs 71.27 GiB" in err and "40.00 GiB of 79.19 GiB is free" in err
    assert "Fix: free the GPU: 39.19 GiB of it is held by another process" in err
    assert "gpuMemoryUtilization` to 0.50" in err
    assert (tmp_path / "termination-log").read_text() == err.rstrip("\n")


def test_warn_reports_the_refusal_and_starts_anyway(execvp: None, plan_file: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(preflight, "read_gpus", _gpus(40.0))
    execed = _run(["--plan", str(plan_file), "--", *ARGV], _env(tmp_path, SPECDEPLOY_PREFLIGHT="warn"))
    assert execed.argv == ARGV
    assert "warning (SPECDEPLOY_PREFLIGHT=warn, starting anyway)" in capsys.readouterr().err


def _no_torch() -> list[GpuMemory]:
    raise GpuUnavailable("torch is not installed in this image (No module named 'torch')")


def test_missing_torch_refuses_unless_warn(execvp: None, plan_file: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(preflight, "read_gpus", _no_torch)
    assert main(["--plan", str(plan_file), "--", *ARGV], _env(tmp_path)) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "cannot read GPU memory: torch is not installed in this image" in err
    assert "SPECDEPLOY_ENGINE=sim" in err and "SPECDEPLOY_PREFLIGHT=warn" in err
    execed = _run(["--plan", str(plan_file), "--", *ARGV], _env(tmp_path, SPECDEPLOY_PREFLIGHT="warn"))
    assert execed.argv == ARGV


def test_preflight_off_needs_no_plan_and_reads_no_gpu(execvp: None, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "read_gpus", _no_torch)
    execed = _run(["--plan", str(tmp_path / "absent.json"), "--", *ARGV], _env(tmp_path, SPECDEPLOY_PREFLIGHT="off"))
    assert execed.argv == ARGV


def test_missing_plan_is_a_clear_error(execvp: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    absent = tmp_path / "absent" / PLAN_FILE
    assert main(["--plan", str(absent), "--", *ARGV], _env(tmp_path)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"plan file {absent} does not exist: mount the SpeculativeDeployment's ConfigMap" in err
    assert "without it the GPU preflight cannot run (SPECDEPLOY_PREFLIGHT=off skips it)" in err
    assert "does not exist" in (tmp_path / "termination-log").read_text()
    assert main(["--plan", str(absent)], _env(tmp_path, SPECDEPLOY_PREFLIGHT="off")) == EXIT_USAGE


def test_missing_plan_with_warn_starts_the_given_command(execvp: None, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    execed = _run(["--plan", str(tmp_path / "absent.json"), "--", *ARGV], _env(tmp_path, SPECDEPLOY_PREFLIGHT="warn"))
    assert execed.argv == ARGV
    assert "starting without the GPU preflight" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    (json.dumps({"argv": ARGV}), "has no `memoryPlan`"),
    (json.dumps({**PLAN, "argv": []}), "has an empty `argv` and no engine command follows `--`"),
])
def test_invalid_plan_is_a_clear_error(execvp: None, tmp_path: Path, content: str, message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / PLAN_FILE
    path.write_text(content)
    assert main(["--plan", str(path)], _env(tmp_path, SPECDEPLOY_PREFLIGHT="off")) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_engine_not_in_the_image_exits_127(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    def missing(file: str, args: list[str]) -> None:
        raise FileNotFoundError(2, "No such file or directory", file)
    monkeypatch.setattr(os, "execvp", missing)
    assert main(["--", "trtllm-serve", "m"], _env(tmp_path, SPECDEPLOY_PREFLIGHT="off")) == EXIT_NOT_FOUND
    assert "'trtllm-serve' is not installed in this image" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ sim mode


def test_sim_mode_execs_the_simulator_on_the_engine_command(execvp: None, plan_file: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "read_gpus", _no_torch)       # no GPU, no preflight
    execed = _run(["--plan", str(plan_file)], _env(tmp_path, SPECDEPLOY_ENGINE="sim",
                                                   SPECDEPLOY_SIM_OPTIONS="--time-scale 0.1"))
    assert execed.file == sys.executable
    assert execed.argv == [sys.executable, "-m", "specdeploy_engine.sim", "--host", "0.0.0.0", "--port", "8000",
                           "--config-dir", str(plan_file.parent), "--time-scale", "0.1", "--", *ARGV]


def test_sim_mode_with_a_command_needs_no_plan(execvp: None, tmp_path: Path) -> None:
    argv = ["trtllm-serve", "m", "--config", "/etc/specdeploy/trtllm.yaml"]        # no --port: the sim's default
    execed = _run(["--", *argv], _env(tmp_path, SPECDEPLOY_ENGINE="sim"))
    assert execed.argv == [sys.executable, "-m", "specdeploy_engine.sim", "--host", "0.0.0.0",
                           "--config-dir", "/etc/specdeploy", "--", *argv]


def test_sim_command_options_are_the_simulators() -> None:
    """Every option the launcher passes is one the simulator's parser accepts (later ones win)."""
    from specdeploy_engine.sim import __main__ as sim_main

    command = sim_command(ARGV, Path("/etc/specdeploy"), ["--port", "18000", "--seed", "3"], python="python3")
    split = command.index("--")
    options = sim_main._options().parse_args(command[3:split])
    assert (options.host, options.port, options.seed, options.config_dir) == ("0.0.0.0", 18000, 3,
                                                                            Path("/etc/specdeploy"))
    assert command[split + 1:] == ARGV


# ------------------------------------------------------------------------------------------ termination log


def test_termination_message_is_cut_to_what_kubernetes_keeps(tmp_path: Path) -> None:
    path = tmp_path / "log"
    write_termination_log(path, "é" * 3000)                  # 6000 bytes of UTF-8
    data = path.read_bytes()
    assert len(data) <= 4096 and data.decode("utf-8") == "é" * 2048


def test_default_termination_log_is_only_written_where_kubernetes_made_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "termination-log"
    monkeypatch.setattr(launch, "DEFAULT_TERMINATION_LOG", default)
    write_termination_log(default, "refused")
    assert not default.exists()
    default.touch()
    write_termination_log(default, "refused")
    assert default.read_text() == "refused"


# ------------------------------------------------------------------------------------------ real processes


def _launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdeploy_engine.launch", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, check=False)


def test_the_launcher_really_execs(tmp_path: Path) -> None:
    done = _launch(["--", sys.executable, "-c", "import os; print('engine', os.getpid())"],
                   _env(tmp_path, SPECDEPLOY_PREFLIGHT="off"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("engine ")


def test_the_launcher_really_refuses_without_torch(plan_file: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    done = _launch(["--plan", str(plan_file), "--", *ARGV], _env(tmp_path))
    assert done.returncode == EXIT_REFUSED
    assert "torch is not installed in this image" in done.stderr
    assert "torch is not installed" in (tmp_path / "termination-log").read_text()


# ------------------------------------------------------------------------------------------ the images


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    result = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def _final_from(instructions: list[tuple[str, str]]) -> str:
    return [rest for keyword, rest in instructions if keyword == "FROM"][-1].split()[0]


def _json_form(instructions: list[tuple[str, str]], keyword: str) -> Any:
    values = [rest for k, rest in instructions if k == keyword]
    assert values, f"no {keyword}"
    return json.loads(values[-1])


@pytest.mark.parametrize(("dockerfile", "engine"), [
    ("Dockerfile", EngineKind.VLLM),
    ("Dockerfile.sglang", EngineKind.SGLANG),
    ("Dockerfile.trtllm", EngineKind.TRTLLM),
])
def test_engine_images_extend_the_default_engine_image_with_the_launcher(dockerfile: str,
                                                                         engine: EngineKind) -> None:
    instructions = _instructions(ROOT / "engine-image" / dockerfile)
    assert _final_from(instructions) == DEFAULT_IMAGES[engine]
    assert _json_form(instructions, "ENTRYPOINT") == ["python3", "-m", "specdeploy_engine.launch"]
    assert _json_form(instructions, "CMD") == []
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "--no-deps" in runs                      # the engine's own packages are left as they are
    assert "import specdeploy_engine.launch" in runs  # the build fails if the launcher cannot import


def test_operator_image_runs_specdeploy_as_a_non_root_user() -> None:
    instructions = _instructions(ROOT / "operator" / "Dockerfile")
    assert _final_from(instructions).startswith("python:3.11-slim")
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert users[-1].split(":")[0].isdigit()        # numeric, so runAsNonRoot can verify it
    assert _json_form(instructions, "ENTRYPOINT") == ["specdeploy", "run"]
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "install --no-index --find-links /wheels specdeploy " in runs   # no extra: no dev cluster's cryptography
    assert "('cryptography', 'specdeploy.devcluster')" in runs               # the build fails if either is there


def test_dockerignore_keeps_the_virtualenv_and_git_out() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert lines[lines.index("*")] == "*"           # everything is left out unless listed below
    assert {"!pyproject.toml", "!README.md", "!operator", "!engine-image/specdeploy_engine"} <= set(lines)
