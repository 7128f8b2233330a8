"""The pod runner's pure decisions: what an engine pod runs, how a kubelet reports a crash, the registry."""

from __future__ import annotations

import asyncio
import copy
import json
import random
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.resource import load_resource
from specdeploy.devcluster import kubeletstatus, nodes, podrunner
from specdeploy.devcluster.enginepod import (
    ConfigVolume,
    config_files,
    engine_pod,
    safe_relative,
    wants_simulator,
)
from specdeploy.devcluster.podrunner import BackOff, PodRunner
from specdeploy.devcluster.simadmin import parse_knob
from specdeploy.devcluster.simregistry import RUNNING, Registry, SimulatorEndpoint, load, parse_sd
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, desired_children

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def _pod_from(example: str, variant: Variant = Variant.SPECULATIVE) -> dict[str, Any]:
    """A pod as the ReplicaSet controller would create it from the rendered Deployment, marked Running."""
    resource = load_resource((REPO / "examples" / example).read_text())
    children = desired_children(resource, make_plan(resource.spec))
    template = copy.deepcopy(children.deployments[variant]["spec"]["template"])
    return {
        "metadata": {"name": "llama-abc-x1", "namespace": "demo", "uid": "0f0e-uid",
                     "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"},
                                                      {"type": "ContainersReady", "status": "True"},
                                                      {"type": "PodScheduled", "status": "True"}],
                   "containerStatuses": [{"name": "engine", "image": "vllm", "ready": True, "restartCount": 0,
                                          "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}}],
                   "hostIP": "127.0.0.1", "podIP": "127.80.0.5", "podIPs": [{"ip": "127.80.0.5"}]},
    }


def test_a_rendered_vllm_pod_runs_its_own_command_line_with_the_podmonitor_labels() -> None:
    pod = _pod_from("llama-8b-ngram.yaml")
    engine = engine_pod(pod)
    assert engine is not None
    container = pod["spec"]["containers"][0]
    assert engine.argv == (*container["command"], *container["args"])
    assert "--speculative-config" in engine.argv
    assert engine.engine == "vllm" and engine.metrics_path == "/metrics" and engine.health_path == "/health"
    assert engine.target_labels()["specdeploy_io_name"] == "llama-8b-ngram"
    assert engine.target_labels()["specdeploy_io_variant"] == "speculative"
    assert {"namespace": "demo", "pod": "llama-abc-x1"}.items() <= engine.target_labels().items()
    assert engine.config == ConfigVolume("llama-8b-ngram-engine", (("speculative.plan.json", "plan.json"),
                                                                   ("preflight.py", "preflight.py")))
    [preflight] = engine.init_containers
    assert (preflight.name, preflight.gpus, preflight.argv[1]) == ("preflight", 1, "/etc/specdeploy/preflight.py")
    assert engine.termination_message_policy == "FallbackToLogsOnError"


def test_the_engine_listens_at_the_pods_ip_and_its_named_container_port() -> None:
    pod = _pod_from("llama-8b-ngram.yaml")
    engine = engine_pod(pod)
    assert engine is not None
    assert (engine.pod_ip, engine.port_name, engine.port) == ("127.80.0.5", "http", 8000)
    del pod["status"]["podIP"]
    del pod["spec"]["containers"][0]["ports"]
    bare = engine_pod(pod)
    assert bare is not None and (bare.pod_ip, bare.port) == ("", None)


def test_the_simulator_is_told_the_pods_ip_and_port(tmp_path: Path) -> None:
    engine = engine_pod(_pod_from("llama-8b-ngram.yaml"))
    assert engine is not None
    argv, _env = PodRunner(tmp_path)._simulator_command(engine, engine.pod_ip, 8000, tmp_path)
    options = argv[:argv.index("--")]
    assert options[options.index("--host") + 1] == "127.80.0.5" and options[options.index("--port") + 1] == "8000"


def test_a_running_pod_without_a_pod_ip_starts_with_the_event_that_carries_one(tmp_path: Path) -> None:
    runner = PodRunner(tmp_path)
    started: list[str] = []

    async def supervise(engine: Any) -> None:
        started.append(f"{engine.pod_ip}:{engine.port}")

    runner._supervise = supervise  # type: ignore[method-assign]
    pod = _pod_from("llama-8b-ngram.yaml")
    without_ip = copy.deepcopy(pod)
    del without_ip["status"]["podIP"]

    async def events() -> None:
        runner._observe(without_ip)
        runner._observe(without_ip)
        assert runner._tasks == {} and "0f0e-uid" in runner._awaiting_ip
        runner._observe(pod)
        await asyncio.gather(*runner._tasks.values())
        assert "0f0e-uid" not in runner._awaiting_ip

    asyncio.run(events())
    assert started == ["127.80.0.5:8000"]


def test_a_pods_address_taken_by_its_previous_run_is_waited_for(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podrunner, "PORT_POLL_SECONDS", 0.01)
    engine = engine_pod(_pod_from("llama-8b-ngram.yaml"))
    assert engine is not None
    listener = socket.create_server(("127.80.0.5", 0))
    port = listener.getsockname()[1]
    assert not podrunner._port_free("127.80.0.5", port) and podrunner._port_free("127.80.0.6", port)

    async def wait() -> None:
        waiting = asyncio.create_task(PodRunner(tmp_path)._until_port_free(engine, "127.80.0.5", port))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        listener.close()
        await asyncio.wait_for(waiting, 5)

    asyncio.run(wait())
    assert podrunner._port_free("127.80.0.5", port)


def test_each_cluster_gets_a_loopback_pod_network_no_running_kwok_uses(tmp_path: Path) -> None:
    for pid, argv in ((10, [b"/cache/bin/kwok", b"--cidr=127.7.0.0/16", b"--node-ip=127.0.0.1"]),
                      (11, [b"python", b"--cidr=127.8.0.0/16"])):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    in_use = nodes.pod_cidrs_in_use(tmp_path)
    assert in_use == {"127.7.0.0/16"}
    choose = random.Random(1)
    assert {nodes.free_pod_cidr(in_use, choose) for _ in range(5000)} == {
        f"127.{n}.0.0/16" for n in range(1, 255) if n != 7}
    with pytest.raises(nodes.DevClusterError, match="in use"):
        nodes.free_pod_cidr({f"127.{n}.0.0/16" for n in range(1, 255)})
    argv = nodes.kwok_argv(Path("kwok"), Path("kubeconfig"), Path("stages"), "127.9.0.0/16")
    assert "--cidr=127.9.0.0/16" in argv and "--node-ip=127.0.0.1" in argv


def test_trtllm_is_scraped_where_trtllm_serve_serves_prometheus_text() -> None:
    engine = engine_pod(_pod_from("trtllm-llama-8b-eagle3.yaml"))
    assert engine is not None and engine.engine == "trtllm"
    assert engine.metrics_path == "/prometheus/metrics"


def test_only_running_labelled_pods_not_being_deleted_get_a_simulator() -> None:
    pod = _pod_from("llama-8b-ngram.yaml")
    assert wants_simulator(pod)
    pending = copy.deepcopy(pod)
    pending["status"]["phase"] = "Pending"
    deleting = copy.deepcopy(pod)
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    unlabelled = copy.deepcopy(pod)
    del unlabelled["metadata"]["labels"]["specdeploy.io/name"]
    assert not any(wants_simulator(p) for p in (pending, deleting, unlabelled))


def test_config_items_are_projected_like_the_kubelet_does() -> None:
    volume = ConfigVolume("cm", (("speculative.plan.json", "plan.json"),))
    assert config_files(volume, {"speculative.plan.json": "{}", "control.plan.json": "[]"}) == {"plan.json": "{}"}
    assert config_files(ConfigVolume("cm", ()), {"a": "1"}) == {"a": "1"}
    with pytest.raises(KeyError, match="speculative.plan.json"):
        config_files(volume, {"control.plan.json": "[]"})
    assert not safe_relative("../etc/passwd") and not safe_relative("/abs") and safe_relative("a/b.json")


def test_the_seed_is_stable_per_pod_and_differs_between_pods() -> None:
    engine = engine_pod(_pod_from("llama-8b-ngram.yaml"))
    other = _pod_from("llama-8b-ngram.yaml")
    other["metadata"]["name"] = "llama-abc-x2"
    second = engine_pod(other)
    assert engine is not None and second is not None
    assert engine.seed == engine_pod(_pod_from("llama-8b-ngram.yaml")).seed  # type: ignore[union-attr]
    assert engine.seed != second.seed and 0 <= engine.seed < 2**31


def test_simulator_options_come_from_the_engine_containers_environment() -> None:
    pod = _pod_from("llama-8b-ngram.yaml")
    assert engine_pod(pod).simulator_options == ()  # type: ignore[union-attr]
    pod["spec"]["containers"][0].setdefault("env", []).append(
        {"name": "SPECDEPLOY_SIM_OPTIONS", "value": "--time-scale 8 --seed '7'"})
    assert engine_pod(pod).simulator_options == ("--time-scale", "8", "--seed", "7")  # type: ignore[union-attr]
    pod["spec"]["containers"][0]["env"][-1]["value"] = "--time-scale '8"
    with pytest.raises(ValueError, match="quotation"):
        engine_pod(pod).simulator_options  # type: ignore[union-attr]  # noqa: B018 - the property raises


@given(st.lists(st.binary(max_size=120), max_size=200))
def test_termination_message_is_at_most_80_lines_and_2048_bytes_of_the_end(lines: list[bytes]) -> None:
    log = b"\n".join(line.replace(b"\n", b" ") for line in lines)
    message = kubeletstatus.termination_message(log)
    tail = b"".join(log.splitlines(keepends=True)[-80:])[-2048:]
    assert message == tail.decode("utf-8", errors="replace")
    assert len(message.splitlines()) <= 80


def test_a_cuda_oom_crash_is_an_error_with_the_log_tail_and_a_crash_loop() -> None:
    pod = _pod_from("llama-8b-ngram.yaml")
    log = b"".join(f"INFO step {i}\n".encode() for i in range(200)) + b"torch.OutOfMemoryError: CUDA out of memory.\n"
    ended = kubeletstatus.termination(1, log, T0, T0 + timedelta(seconds=30))
    assert ended.reason == "Error" and ended.exit_code == 1
    assert ended.message.endswith("CUDA out of memory.\n") and "step 199" in ended.message
    assert "step 100" not in ended.message   # only the last 80 lines
    status = kubeletstatus.crashed_status(pod, "engine", ended, back_off=2.0)
    engine = status["containerStatuses"][0]
    assert engine["restartCount"] == 1 and engine["ready"] is False
    assert engine["lastState"]["terminated"]["finishedAt"] == "2025-01-02T03:04:35Z"
    assert engine["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert engine["state"]["waiting"]["message"] == (
        "back-off 2s restarting failed container=engine pod=llama-abc-x1_demo(0f0e-uid)")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "ContainersNotReady"
    assert conditions["Ready"]["message"] == "containers with unready status: [engine]"
    assert conditions["PodScheduled"]["status"] == "True"


def test_signals_exit_zero_and_file_policy() -> None:
    killed = kubeletstatus.termination(-9, b"bye\n", T0, T0)
    assert (killed.exit_code, killed.reason) == (137, "Error")
    assert kubeletstatus.termination(0, b"bye\n", T0, T0).message == ""   # the log only on error
    assert kubeletstatus.termination(3, b"bye\n", T0, T0, policy="File").message == ""


def test_running_again_keeps_last_state_and_counts_and_is_ready() -> None:
    pod = _pod_from("llama-8b-ngram.yaml")
    ended = kubeletstatus.termination(1, b"boom\n", T0, T0)
    pod["status"].update(kubeletstatus.crashed_status(pod, "engine", ended, back_off=1.0))
    pod["status"].update(kubeletstatus.crashed_status(pod, "engine", ended, back_off=2.0))
    back = kubeletstatus.running_status(pod, "engine", T0 + timedelta(seconds=5), ready=True)
    engine = back["containerStatuses"][0]
    assert engine["restartCount"] == 2 and engine["lastState"]["terminated"]["message"] == "boom\n"
    assert engine["state"] == {"running": {"startedAt": "2025-01-02T03:04:10Z"}} and engine["ready"] is True
    assert {c["type"]: c["status"] for c in back["conditions"]}["Ready"] == "True"
    assert "reason" not in {c["type"]: c for c in back["conditions"]}["Ready"]


def test_back_off_doubles_to_its_cap() -> None:
    assert [BackOff().delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert kubeletstatus.go_duration(2.0) == "2s" and kubeletstatus.go_duration(90) == "1m30s"


def _sim(pod: str, variant: str, state: str = RUNNING) -> SimulatorEndpoint:
    return SimulatorEndpoint("demo", pod, f"uid-{pod}", "llama", variant, "vllm", "127.0.0.1:1", "/metrics",
                             "/health", pid=7, state=state)


def test_registry_round_trips_and_selects(tmp_path: Path) -> None:
    registry = Registry(runner_pid=1, synced=True)
    for sim in (_sim("b", "speculative"), _sim("a", "speculative"), _sim("c", "control", "BackOff")):
        registry.simulators[sim.uid] = sim
    path = tmp_path / "sims.json"
    registry.save(path)
    loaded = load(path)
    assert loaded.synced and [s.pod for s in loaded.select(variant="speculative")] == ["a", "b"]
    assert [s.ready for s in loaded.select(sd="llama", variant="control")] == [False]
    assert loaded.select(namespace="other") == []
    assert load(tmp_path / "missing.json").simulators == {}
    assert json.loads(path.read_text())["runnerPid"] == 1


def test_sd_references_and_knobs_parse() -> None:
    assert parse_sd("demo/llama") == ("demo", "llama") and parse_sd("llama") == ("default", "llama")
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_sd("demo/")
    assert parse_knob("acceptance=0.3") == ("acceptance", 0.3)
    assert parse_knob("oom=true") == ("oom", True)
    assert parse_knob("mode=fast") == ("mode", "fast")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_knob("acceptance")
    with pytest.raises(ValueError, match="must be a number"):
        parse_knob("acceptance=[1]")
