"""How the simulator plays each engine beyond its command line (argv.py) and its metric names (the operator's
`metric_names`): one row per engine, each answer from the engine's own source, so that a new engine is a row here
rather than a branch in every module. The simulator models the engines on its own, not from the operator's
`EngineProfile`, so that a test can catch the two disagreeing."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from specdeploy.api.spec import EngineKind


class CrashSite(NamedTuple):
    """Where the engine logs a fatal error from its engine loop: the file (under dist-packages), the function and the
    headline it prints before the traceback."""

    path: str
    function: str
    headline: str


@dataclass(frozen=True)
class SimulatedEngine:
    """One engine's behaviour that the simulator reproduces."""

    owned_by: str                    # `owned_by` of its /v1/models entries
    crash_site: CrashSite
    server_info: bool                # serves GET /server_info (SGLang: its adaptive tier)
    # A batch-size table's k is looked up at the end of a step for the requests it scheduled and drafted for the next
    # (vLLM); otherwise the drafter drafts and the target verifies in one iteration, for the batch it runs (TensorRT-LLM).
    batch_table_drafts_ahead: bool
    drafter_runs_at_zero_k: bool     # a step drafting 0 tokens still runs the drafter (vLLM)
    # Sizes its KV cache from what is free after loading (free_gpu_memory_fraction), which the command line does not
    # carry fully, so a too-small KV cache is not refused at start-up (TensorRT-LLM).
    sizes_kv_after_loading: bool


SIMULATED_ENGINES: MappingProxyType[EngineKind, SimulatedEngine] = MappingProxyType({
    EngineKind.VLLM: SimulatedEngine(
        owned_by="vllm",
        crash_site=CrashSite("vllm/v1/engine/core.py", "run_engine_core", "EngineCore encountered a fatal error."),
        server_info=False,
        # vllm/v1/core/sched/scheduler.py: num_spec_tokens_to_schedule = dynamic_sd_lookup[len(num_scheduled_tokens)]
        batch_table_drafts_ahead=True,
        # vllm#49548 (the drafter's forward at k = 0), vllm#49986 (20-31% over no speculation).
        drafter_runs_at_zero_k=True,
        sizes_kv_after_loading=False,
    ),
    EngineKind.SGLANG: SimulatedEngine(
        owned_by="sglang",
        crash_site=CrashSite("sglang/srt/managers/scheduler.py", "run_scheduler_process", "Scheduler hit an exception"),
        server_info=True,
        batch_table_drafts_ahead=False,   # no batch table: its adaptive tiers follow acceptance
        drafter_runs_at_zero_k=False,     # its tiers never reach 0
        sizes_kv_after_loading=False,
    ),
    EngineKind.TRTLLM: SimulatedEngine(
        owned_by="tensorrt_llm",
        crash_site=CrashSite("tensorrt_llm/_torch/pyexecutor/py_executor.py", "_executor_loop", "Error in event loop"),
        server_info=False,
        batch_table_drafts_ahead=False,   # Drafter._effective_draft_len
        drafter_runs_at_zero_k=False,     # tensorrt_llm/_torch/speculative/drafter.py `should_use_spec_decode`
        sizes_kv_after_loading=True,
    ),
})
