"""What the operator knows about one engine, in one value: its `EngineProfile`.

    profile = engine_profile(EngineKind.SGLANG)      # from specdeploy.engines
    profile.methods[Method.MTP]                      # "NEXTN"
    profile.memory.budget                            # MemoryBudget.SHARE_OF_FREE_FOR_WEIGHTS_AND_KV
    profile.multi_node.pipeline_speculation_refusal  # "SGLang refuses pipeline parallelism with speculative …"

Each engine module (vllm.py, sglang.py, trtllm.py) builds its profile next to its renderer; the plan's rules, the
memory budget, the schedule, the node layout and the pod runner read the profile instead of asking which engine
runs. Every field is an answer: an engine that lacks one does not construct (no field has a default), and
tests/unit/test_engine_profiles.py refuses a None. An empty mapping or "" is an answer ("none").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from specdeploy.api.spec import EngineKind, Method
from specdeploy.api.speculative_keys import ManagedKey
from specdeploy.api.status import Severity
from specdeploy.engines.base import EngineCommand, EngineInputs, MetricNames, NodeRank

# Field paths, as a user writes them in YAML: the owners of the flags the operator renders (`managed_flags`).
MODEL_FIELD = "spec.model.name"
REVISION_FIELD = "spec.model.revision"
QUANTIZATION_FIELD = "spec.model.quantization"
DTYPE_FIELD = "spec.model.dtype"
SPECULATION_FIELD = "spec.speculation"
TP_FIELD = "spec.resources.tensorParallelSize"
UTILIZATION_FIELD = "spec.resources.gpuMemoryUtilization"
MAX_MODEL_LEN_FIELD = "spec.serving.maxModelLen"
MAX_NUM_SEQS_FIELD = "spec.serving.maxNumSeqs"
MAX_BATCHED_FIELD = "spec.serving.maxNumBatchedTokens"
KV_DTYPE_FIELD = "spec.serving.kvCacheDtype"
KV_MEMORY_FIELD = "spec.serving.kvCacheMemoryGiB"
PORT_FIELD = "spec.serving.port"
# Flags the operator sets from no spec field: the reason stands where the owner would.
HOST_REASON = "the pod must listen on all interfaces for its Service and probes"
SERVED_NAME_REASON = "clients and the engine's metrics use one model name the operator chooses"
PP_FIELD = "spec.resources.pipelineParallelSize"
NODES_REASON = "the operator places a layout's ranks on nodes (a LeaderWorkerSet's leader and workers)"


@dataclass(frozen=True)
class ManagedFlags:
    """The command-line flags the operator renders, so `spec.engine.extraArgs` must not set them
    (planning/managed_flags.py finds them)."""

    owned: Mapping[str, str]            # flag -> the spec field that sets it, or why the operator sets it itself
    owned_prefixes: Mapping[str, str]   # flag prefix -> the owner of every flag starting with it
    removed: Mapping[str, str]          # flags the engine no longer has -> what replaced them
    removed_prefixes: Mapping[str, str]   # every other flag starting with a prefix is gone too -> what replaced them
    abbreviations: bool                 # argparse (allow_abbrev): an unambiguous prefix of a long flag counts
    spelling: Callable[[str], str]      # a long flag as the parser reads it (vLLM: `_` as `-`, `--a.b` as `--a`)


class UnmodelledKey(NamedTuple):
    """An extraConfig key the plan passes on but does not model: the finding it gets."""

    severity: Severity
    code: str
    note: str     # what the plan does not model, after "is passed to the engine as set, but"


@dataclass(frozen=True)
class SpeculativeConfigKeys:
    """The engine's speculative config object, into which `spec.speculation.extraConfig` is merged."""

    describe: Callable[[Method], str | None]       # the object as a message names it; None: no object for the method
    known: Callable[[Method], frozenset[str]]      # every key of the object the method selects
    managed: Mapping[str, ManagedKey]              # keys the operator renders from typed fields
    unsettable: Mapping[str, str]                  # keys the engine fills in itself -> why
    spelling: Callable[[str], str]                 # a key as the engine reads it
    unmodelled: Mapping[str, UnmodelledKey]        # keys that change what the plan assumes
    method_only: Mapping[str, Method]              # keys the engine accepts with one method only
    since_default_image: frozenset[str]            # keys an older image than the default refuses
    schedule_keys: tuple[str, ...]                 # keys a typed schedule renders
    # Tokens a draft tree set in extraConfig verifies per sequence each step, root included, given the extraConfig
    # and k; None for a chain.
    tree_verify_tokens: Callable[[Mapping[str, Any], int], int | None]


@dataclass(frozen=True)
class NoSpeculativeConfig:
    """The engine has no speculative config object: an extraConfig is refused, for `why`."""

    why: str


class MemoryBudget(StrEnum):
    """What `spec.resources.gpuMemoryUtilization` is a share of, and so where a drafter's memory comes from."""

    SHARE_OF_GPU = "ShareOfGpu"
    """utilization × the GPU's memory holds weights (the drafter's too), overheads and the KV cache (vLLM's
    --gpu-memory-utilization; TensorRT-LLM, whose KV fraction the plan computes from the same budget)."""
    SHARE_OF_FREE_FOR_WEIGHTS_AND_KV = "ShareOfFreeForWeightsAndKv"
    """utilization × the memory free after the CUDA context holds the target's weights and the KV cache; the
    drafter's weights, activations and CUDA graphs come out of the rest (SGLang's --mem-fraction-static)."""


@dataclass(frozen=True)
class MemoryAccounting:
    """How the engine divides a GPU, as the memory plan counts it."""

    budget: MemoryBudget
    start_needs_budget_free: bool    # refuses to start unless utilization × total is free (vLLM request_memory)
    fixed_kv_cache: bool             # takes a fixed KV cache size per GPU (spec.serving.kvCacheMemoryGiB)
    kv_fraction_of_free: bool        # sizes its KV cache as a fraction of what is free after weights (TensorRT-LLM)


class ScheduleExpression(StrEnum):
    """How the engine changes k while it runs (spec.speculation.schedule)."""

    BATCH_TABLE = "BatchTable"                    # k per batch-size range, any shape (vLLM)
    LARGEST_K_FIRST_TABLE = "LargestKFirstTable"  # k per batch-size range, the largest at the smallest batch
    ACCEPTANCE_TIERS = "AcceptanceTiers"          # moves between tiers of k ≥ 1 by measured acceptance (SGLang)


@dataclass(frozen=True)
class ScheduleSupport:
    """What schedules the engine can express and what a step drafting 0 tokens costs it."""

    expression: ScheduleExpression
    methods: frozenset[Method]     # the methods with which it changes k
    single_chain_only: bool        # only while it drafts a chain (spec.speculation.eagleTopk 1)
    limit: str                     # why a schedule is refused outside `methods`, as a finding says it; "" for none
    zero_k_speedup: float          # a k = 0 step's speed against no speculation at all
    zero_k_cost: str               # what a k = 0 step costs, as a finding says it; "" when it costs nothing
    threshold_risk: str            # what is known to go wrong at a table's thresholds; "" for nothing


class AcceptanceSignal(StrEnum):
    """What the engine exports for acceptance, so how a window's acceptance rate is normalised."""

    TOKEN_COUNTERS = "TokenCounters"
    """Counters of drafted and accepted tokens (and drafts, and accepted per position): rate(accepted) ÷
    rate(drafted) over the window (vLLM)."""
    POSITION_COUNTERS = "PositionCounters"
    """Token counters, with the drafts that proposed each position counted per position, so a position's
    acceptance is divided by its own drafts when drafts differ in length (TensorRT-LLM)."""
    GAUGES = "Gauges"
    """Gauges of the acceptance rate and length, most recent value only: the rate is read as exported (SGLang)."""


class MethodRefusal(NamedTuple):
    """A method the engine refuses for a reason more specific than not having it; `message` takes {target}."""

    code: str
    message: str


class BlockDrafterNote(NamedTuple):
    """What the engine changes for a block drafter (dflash, dspark): an Info finding."""

    code: str
    message: str


@dataclass(frozen=True)
class NoMultiNodeLaunch:
    """The operator renders no launch of the engine across nodes: a layout that spans nodes is refused, for `why`."""

    why: str     # as a finding says it, after "must not run a layout across N nodes: "


@dataclass(frozen=True)
class MultiNode:
    """How the engine runs a layout of more GPUs than a node holds: tensor parallelism within a node, pipeline stages
    across nodes, one pod per node with the same serve command plus its rank's flags (planning/topology.py,
    reconcile/leaderworkerset.py)."""

    launch: Callable[[NodeRank], list[str]] | NoMultiNodeLaunch   # the flags that make a pod one node of the layout
    # Why the engine refuses to speculate with pipeline stages (on one node as well), with the fix, as a finding
    # says it after "must be 1 for <engine> with speculation, got N: "; "" when it speculates with them.
    pipeline_speculation_refusal: str


@dataclass(frozen=True)
class EngineProfile:
    """Everything specdeploy knows about one engine: its renderer and the answers the plan, the schedule and the pod
    runner ask of it."""

    kind: EngineKind
    methods: Mapping[Method, str]            # spec method -> the engine's name for it (`method_setting`)
    method_setting: str                      # where that name goes on the engine
    method_refusals: Mapping[Method, MethodRefusal]
    managed_flags: ManagedFlags
    extra_config: SpeculativeConfigKeys | NoSpeculativeConfig
    memory: MemoryAccounting
    schedules: ScheduleSupport
    tree_drafting: bool                      # honours spec.speculation.eagleTopk > 1 (a draft tree)
    draft_runs_at_own_tp: bool               # runs a draft at TP 1 as well as at the target's TP
    refuses_padded_vocabulary: bool          # refuses a draft whose vocabulary is padded to another size
    renders_quantization_flag: bool          # passes spec.model.quantization to the engine as a flag
    mtp_documented_for: tuple[str, ...]      # model families its MTP is documented for; () for any
    block_drafter_notes: Mapping[Method, BlockDrafterNote]
    multi_node: MultiNode
    acceptance: AcceptanceSignal
    metrics: MetricNames
    metrics_path: str
    default_image: str
    runs: Callable[[Sequence[str]], bool]    # whether a container's command line starts this engine
    render: Callable[[EngineInputs], EngineCommand]   # the renderer: the spec (and the plan's numbers) -> its command


def command_head(argv: Sequence[str]) -> list[str]:
    """The program words of a command line: the base names of its first four words (a launcher, an interpreter,
    `-m`, a module), where every engine's recogniser (`EngineProfile.runs`) looks."""
    return [word.rsplit("/", 1)[-1] for word in argv[:4]]
