"""`specdeploy plan | render | crd`: exit codes, JSON shape, and errors as sentences."""

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from specdeploy.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
REJECTED = {"llama-70b-bf16-h100-rejected"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_plan_every_example(path: Path) -> None:
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == (1 if path.stem in REJECTED else 0), result.output
    assert "Verdict:" in result.output
    assert "memory per GPU" in result.output
    if path.stem in REJECTED:
        assert "what would fit" in result.output
    else:
        assert "engine command" in result.output


def test_plan_json_is_the_memory_plan_with_command_and_speedup() -> None:
    result = CliRunner().invoke(main, ["plan", "-o", "json", str(EXAMPLES[0].parent / "llama-70b-fp8-tp2.yaml")])
    document = json.loads(result.output)
    assert {"verdict", "fits", "perGpu", "kvBytesPerToken", "kvCacheTokens", "maxConcurrency", "draftCost",
            "reasons", "suggestions", "engineCommand", "speedup", "models"} <= document.keys()
    assert {"target", "draft"} == document["models"].keys()
    assert {"budgetGiB", "targetWeightsGiB", "draftWeightsGiB", "overheadGiB", "kvCacheGiB"} <= document["perGpu"].keys()
    assert {"kvCacheGiB", "kvCacheTokens", "concurrentSequences"} <= document["draftCost"].keys()
    assert document["maxConcurrency"] == pytest.approx(document["kvCacheTokens"] / 32768, abs=0.01)


def test_rejected_plan_json_has_reasons_and_suggestions() -> None:
    result = CliRunner().invoke(main, ["plan", "-o", "json", str(EXAMPLES[0].parent / "llama-70b-bf16-h100-rejected.yaml")])
    assert result.exit_code == 1
    document = json.loads(result.output)
    assert document["verdict"] == "Rejected"
    assert document["reasons"] and document["suggestions"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: SpeculativeDeployment\nspec: [unclosed", "not valid YAML"),
        ("kind: SpeculativeDeployment\nspec:\n  model: {name: x, quantisation: fp8}\n  speculation: {method: ngram}\n",
         "`spec.model.quantisation`: unknown field"),
        ("kind: SpeculativeDeployment\nspec:\n  model: {name: acme/secret-model}\n  speculation: {method: ngram}\n",
         "spec.model.architecture"),
        ("kind: Deployment\n", "no document of kind SpeculativeDeployment"),
    ],
)
def test_bad_input_exits_2_with_a_sentence(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "sd.yaml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


def test_missing_file_exits_2() -> None:
    result = CliRunner().invoke(main, ["plan", "/nonexistent/sd.yaml"])
    assert result.exit_code == 2
    assert "cannot read" in result.output


def test_render_prints_children_and_refuses_rejected() -> None:
    ok = CliRunner().invoke(main, ["render", str(EXAMPLES[0].parent / "llama-70b-fp8-tp2.yaml")])
    assert ok.exit_code == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(ok.output)]
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Service"]
    rejected = CliRunner().invoke(main, ["render", str(EXAMPLES[0].parent / "llama-70b-bf16-h100-rejected.yaml")])
    assert rejected.exit_code == 1
    assert "WeightsDoNotFit" in rejected.output


def test_crd_command_prints_the_crd() -> None:
    result = CliRunner().invoke(main, ["crd"])
    assert yaml.safe_load(result.output)["kind"] == "CustomResourceDefinition"


def test_plan_prints_the_auto_acceptance_floor() -> None:
    result = CliRunner().invoke(main, ["plan", str(EXAMPLES[0].parent / "sglang-llama-8b-eagle3.yaml")])
    assert result.exit_code == 0, result.output
    text = " ".join(" ".join(line.strip("│ ") for line in result.output.splitlines()).split())
    assert ("acceptance floor — Auto: break-even 0.09 at batch 1 for eagle3 k=3 (draft 9% of a target step on "
            "H100-80GB), floor 0.11 with the 5% margin; 0.15 at maxNumSeqs 48") in text


def test_plan_prints_a_fixed_acceptance_floor_with_the_models_break_even() -> None:
    result = CliRunner().invoke(main, ["plan", str(EXAMPLES[0].parent / "llama-70b-fp8-tp2.yaml")])
    text = " ".join(" ".join(line.strip("│ ") for line in result.output.splitlines()).split())
    assert "acceptance floor — Fixed: minAcceptanceRate 0.50 (the model's break-even at batch 1: 0.19)" in text


@pytest.mark.parametrize(
    ("example", "expected"),
    [("llama-70b-fp8-tp2.yaml", {"rate": 0.5, "breakEven": 0.191, "batchSize": 1, "source": "Fixed"}),
     ("sglang-llama-8b-eagle3.yaml", {"rate": 0.11, "breakEven": 0.089, "batchSize": 1, "source": "Auto"})],
)
def test_plan_json_has_the_acceptance_floor(example: str, expected: dict[str, object]) -> None:
    result = CliRunner().invoke(main, ["plan", "-o", "json", str(EXAMPLES[0].parent / example)])
    assert json.loads(result.output)["acceptanceFloor"] == expected


def test_plan_json_without_speculation_has_no_acceptance_floor(tmp_path: Path) -> None:
    document = yaml.safe_load((EXAMPLES[0].parent / "sglang-llama-8b-eagle3.yaml").read_text())
    document["spec"]["speculation"]["enabled"] = False
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(main, ["plan", "-o", "json", str(path)])
    assert json.loads(result.output)["acceptanceFloor"] is None


def test_plan_json_outcome_agrees_with_the_exit_code_and_the_text_on_a_compatibility_error(tmp_path: Path) -> None:
    document = yaml.safe_load((EXAMPLES[0].parent / "trtllm-llama-8b-eagle3.yaml").read_text())
    document["spec"]["speculation"]["method"] = "eagle"     # TensorRT-LLM runs EAGLE-3 heads only
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(document))
    as_json = CliRunner().invoke(main, ["plan", "-o", "json", str(path)])
    as_text = CliRunner().invoke(main, ["plan", str(path)])
    plan = json.loads(as_json.output)
    assert as_json.exit_code == as_text.exit_code == 1
    assert plan["outcome"] == "Rejected" and "Verdict: Rejected" in as_text.output
    assert plan["verdict"] in ("Fits", "FitsWithWarnings")   # the memory plan's own verdict: it does fit
    assert not plan["compatibility"]["compatible"] and plan["engineCommand"] is None


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_plan_json_outcome_is_the_text_verdict(path: Path) -> None:
    as_json = CliRunner().invoke(main, ["plan", "-o", "json", str(path)])
    as_text = CliRunner().invoke(main, ["plan", str(path)])
    assert as_json.exit_code == as_text.exit_code
    assert f"Verdict: {json.loads(as_json.output)['outcome']}" in as_text.output


def test_speculation_disabled_needs_no_method(tmp_path: Path) -> None:
    document = yaml.safe_load((EXAMPLES[0].parent / "llama-8b-ngram.yaml").read_text())
    document["spec"]["speculation"] = {"enabled": False}
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(document))
    planned = CliRunner().invoke(main, ["plan", "-o", "json", str(path)])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)
    assert plan["outcome"] == "Fits" and plan["speedup"] is None and plan["acceptanceFloor"] is None
    assert not any(arg.startswith("--speculative") for arg in plan["engineCommand"]["args"])
    rendered = CliRunner().invoke(main, ["render", str(path)])
    assert rendered.exit_code == 0 and "speculative-config" not in rendered.output


def test_speculation_enabled_without_a_method_is_refused_with_the_fix(tmp_path: Path) -> None:
    document = yaml.safe_load((EXAMPLES[0].parent / "llama-8b-ngram.yaml").read_text())
    document["spec"]["speculation"] = {"numSpeculativeTokens": 3}
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2
    assert "`spec.speculation.method` is required while `spec.speculation.enabled` is true" in result.output
    assert "or set enabled to false" in result.output


# --- kubectl's habits: the flags every cluster command takes, and how they pick a context -----------------------

KUBECONFIG = """
apiVersion: v1
kind: Config
current-context: dev
clusters:
- {name: dev, cluster: {server: "https://127.0.0.1:1"}}
- {name: prod, cluster: {server: "https://10.0.0.1:6443"}}
users:
- {name: me, user: {token: not-a-secret}}
contexts:
- {name: dev, context: {cluster: dev, user: me, namespace: team-a}}
- {name: prod, context: {cluster: prod, user: me}}
"""


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and "0.1.0" in result.output


@pytest.mark.parametrize("command", ["get", "probe", "retry", "pause", "resume"])
def test_every_cluster_command_takes_kubectls_flags(command: str) -> None:
    options = {name for param in main.commands[command].params for name in getattr(param, "opts", [])}
    assert {"-n", "--namespace", "--kubeconfig", "--context"} <= options


@pytest.mark.parametrize(("flags", "server", "namespace"), [
    ([], "https://127.0.0.1:1", "team-a"),                       # the current context and its namespace
    (["-n", "other"], "https://127.0.0.1:1", "other"),
    (["--context", "prod"], "https://10.0.0.1:6443", "default"),  # a context without a namespace
])
def test_the_context_and_namespace_are_kubectls(tmp_path: Path, flags: list[str], server: str,
                                                 namespace: str) -> None:
    from specdeploy.clients.cluster_access import cluster_access

    (tmp_path / "config").write_text(KUBECONFIG)
    context = flags[1] if flags[:1] == ["--context"] else None
    chosen = flags[1] if flags[:1] == ["-n"] else None
    access = cluster_access(str(tmp_path / "config"), context, chosen)
    assert access.config.cluster.server == server and access.namespace == namespace
    assert access.pod_proxy_url("chat-spec-0", 8000) == f"{server}/api/v1/namespaces/{namespace}/pods/chat-spec-0:8000/proxy"


def test_an_unknown_context_is_a_sentence(tmp_path: Path) -> None:
    (tmp_path / "config").write_text(KUBECONFIG)
    result = CliRunner().invoke(main, ["get", "chat", "--kubeconfig", str(tmp_path / "config"), "--context", "nope"])
    assert result.exit_code == 2 and "nope" in result.output and "Traceback" not in result.output


def test_probe_of_a_file_needs_the_url(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["probe", str(EXAMPLES[0].parent / "llama-8b-ngram.yaml"), "--offline"])
    assert result.exit_code == 2 and "give --url" in result.output


def test_probe_sd_is_deprecated_and_still_parsed() -> None:
    result = CliRunner().invoke(main, ["probe", "--sd", "no-slash"])
    assert result.exit_code == 2
    assert "--sd NAMESPACE/NAME is deprecated: give NAME -n NAMESPACE" in result.output
    assert "expected NAMESPACE/NAME" in result.output


def test_plan_plot_names_the_formats_it_writes(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["plan", "--offline", "--plot", str(tmp_path / "speedup.jpg"),
                                       str(EXAMPLES[0].parent / "llama-8b-ngram.yaml")])
    assert result.exit_code == 2 and "name a .png or .svg file" in result.output


def test_plan_plot_writes_the_picture(tmp_path: Path) -> None:
    picture = tmp_path / "speedup.svg"
    result = CliRunner().invoke(main, ["plan", "--offline", "--plot", str(picture),
                                       str(EXAMPLES[0].parent / "llama-8b-ngram.yaml")])
    assert result.exit_code == 0, result.output
    assert picture.read_text().lstrip().startswith("<?xml") and "<svg" in picture.read_text()


def test_a_picture_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib raises ImportError
    result = CliRunner().invoke(main, ["plan", "--offline", "--plot", str(tmp_path / "speedup.png"),
                                       str(EXAMPLES[0].parent / "llama-8b-ngram.yaml")])
    assert result.exit_code == 2 and "pip install 'specdeploy[plot]'" in result.output
    assert not (tmp_path / "speedup.png").exists()


def test_pause_sets_the_annotation_and_resume_removes_it_each_once() -> None:
    from specdeploy.cli import pause_patch
    from specdeploy.reconcile.decide import PAUSED_ANNOTATION

    running = {"metadata": {"name": "chat", "namespace": "team-a", "annotations": {}}}
    patch, said = pause_patch(running, "2026-12-05T23:30:00Z")
    assert patch == {"metadata": {"annotations": {PAUSED_ANNOTATION: "2026-12-05T23:30:00Z"}}}
    assert said.startswith(f"team-a/chat: {PAUSED_ANNOTATION}=2026-12-05T23:30:00Z;")
    assert pause_patch(running, None) == (None, "team-a/chat: the judgment is not paused; nothing to resume")
    held = {"metadata": {**running["metadata"], "annotations": {PAUSED_ANNOTATION: "2026-12-05T23:30:00Z"}}}
    patch, said = pause_patch(held, None)
    assert patch == {"metadata": {"annotations": {PAUSED_ANNOTATION: None}}}   # merge patch: null removes it
    again, said = pause_patch(held, "2026-12-05T23:31:00Z")
    assert again is None and "paused already" in said
