"""The SpeculativeDeployment spec: what the user wants. The operator reads it and never writes it.

Field names are the contract of ../shared/DESIGN.md; the CRD schema is generated from these models
(`specdeploy crd`), so every description here is what `kubectl explain` prints.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, JsonValue, field_validator

from specdeploy.api import kube
from specdeploy.api.base import CelRule, WireModel
from specdeploy.api.speculative_keys import (
    MANAGED_KEYS,
    MAX_EXTRA_CONFIG_KEYS,
    MAX_EXTRA_CONFIG_TEXT,
    ManagedKey,
)
from specdeploy.api.units import Duration, MemoryGiB


class EngineKind(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class Quantization(StrEnum):
    NONE = "none"
    FP8 = "fp8"
    INT8 = "int8"
    AWQ = "awq"
    GPTQ = "gptq"
    INT4 = "int4"


class Dtype(StrEnum):
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class KvCacheDtype(StrEnum):
    AUTO = "auto"
    FP8 = "fp8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"


class Method(StrEnum):
    DRAFT_MODEL = "draft_model"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    NGRAM = "ngram"
    SUFFIX = "suffix"
    # Block drafters: one parallel pass proposes the whole block from the target's hidden states (vLLM
    # vllm/config/speculative.py DFlashModelTypes / DSparkModelTypes; SGLang --speculative-algorithm DFLASH / DSPARK).
    DFLASH = "dflash"
    DSPARK = "dspark"
    # n-gram matching on the GPU (vLLM NgramGPUTypes, vllm/v1/spec_decode/ngram_proposer_gpu.py); vLLM only.
    NGRAM_GPU = "ngram_gpu"


METHODS_WITH_DRAFT = (Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3, Method.DFLASH, Method.DSPARK)
METHODS_WITHOUT_DRAFT = (Method.MTP, Method.NGRAM, Method.SUFFIX, Method.NGRAM_GPU)
# Block drafters: one drafting pass proposes all k tokens.
BLOCK_METHODS = (Method.DFLASH, Method.DSPARK)
# Methods that propose tokens by matching earlier text: no drafter model, no drafting pass on the GPU's model.
NGRAM_METHODS = (Method.NGRAM, Method.NGRAM_GPU)
# Methods only vLLM runs (SGLang's and TensorRT-LLM's inventories have neither: tests/data/engine-flags/).
VLLM_ONLY_METHODS = (Method.SUFFIX, Method.NGRAM_GPU)


class ScheduleMode(StrEnum):
    """How k follows the batch size (docs/schedules.md)."""

    FIXED = "Fixed"    # numSpeculativeTokens at every batch size: no table rendered
    AUTO = "Auto"      # derived from the roofline and the acceptance per draft position
    TABLE = "Table"    # the ranges in `table`


class BaselineMode(StrEnum):
    CONTROL = "Control"
    PREVIOUS = "Previous"
    NONE = "None"


class Objective(StrEnum):
    """What the analysis judges speculation by (docs/analysis.md "Objectives")."""

    LATENCY = "Latency"          # time in the engine per request and per token, against the control
    THROUGHPUT = "Throughput"    # the load a variant sustains: its queueing and output tokens per GPU
    BOTH = "Both"


class OnInconclusive(StrEnum):
    HOLD = "Hold"
    ROLLBACK = "Rollback"


class AnalysisMode(StrEnum):
    ACT = "Act"
    OBSERVE = "Observe"


class Reenable(StrEnum):
    MANUAL = "Manual"
    AUTO = "Auto"


def _cel_list(values: tuple[StrEnum, ...]) -> str:
    return "[" + ", ".join(f"'{v.value}'" for v in values) + "]"


def _words(values: tuple[StrEnum, ...]) -> str:
    names = [v.value for v in values]
    return ", ".join(names[:-1]) + " or " + names[-1]


MAX_ENGINE_TEXT = 16384
"""Characters of `extraArgs` and `env` together. The operator copies them into each Deployment, the engine
ConfigMap (1 MiB at most) and kopf's last-handled annotation (256 KiB for all annotations, beside
kubectl's last-applied copy of the whole object); a few hundred KiB would fail there, after the
apiserver had accepted the object."""


class EnvVar(WireModel):
    """An environment variable for the engine container."""

    name: str = Field(min_length=1, max_length=256, description="Variable name.")
    value: str = Field("", max_length=MAX_ENGINE_TEXT, description="Variable value.")


def _engine_text(engine: Engine) -> int:
    return sum(len(a) for a in engine.extra_args) + sum(len(e.name) + len(e.value) for e in engine.env)


class Engine(WireModel):
    """Which inference engine runs the model, and how."""

    kind: EngineKind = Field(EngineKind.VLLM, description="The engine: vllm, sglang or trtllm.")
    image: str | None = Field(
        None, max_length=512, description="Container image; a default per engine when empty."
    )
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=128,
        description="Further engine arguments. Flags the operator manages (speculation, memory, "
        "parallelism) are refused here; set the matching spec field instead.",
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description="Extra environment.")

    cel_rules = (
        CelRule(
            "self.extraArgs.map(a, a.size()).sum() + self.env.map(e, e.name.size() + e.value.size()).sum() "
            f"<= {MAX_ENGINE_TEXT}",
            f"`spec.engine.extraArgs` and `spec.engine.env` must together be at most {MAX_ENGINE_TEXT} characters: "
            "the operator copies them into every Deployment and the engine ConfigMap; keep large configuration "
            "in the image or a mounted file",
            lambda e: _engine_text(e) <= MAX_ENGINE_TEXT,
        ),
        CelRule(
            "self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            "`spec.engine.env` must not set a variable twice: a container's env is keyed by name",
            lambda e: len({v.name for v in e.env}) == len(e.env),
        ),
    )


class Architecture(WireModel):
    """The numbers of a model's config.json the memory plan needs (for models not in the catalog)."""

    num_layers: int = Field(ge=1, le=1024, description="num_hidden_layers")
    hidden_size: int = Field(ge=1, le=1_000_000, description="hidden_size")
    intermediate_size: int = Field(ge=1, le=10_000_000, description="intermediate_size (dense MLP)")
    num_attention_heads: int = Field(ge=1, le=4096, description="num_attention_heads")
    num_key_value_heads: int = Field(ge=1, le=4096, description="num_key_value_heads (GQA)")
    head_dim: int | None = Field(
        None, ge=1, le=4096, description="head_dim; hiddenSize / numAttentionHeads when empty"
    )
    vocab_size: int = Field(ge=1, le=10_000_000, description="vocab_size")
    num_parameters: int = Field(ge=1, le=100_000_000_000_000, description="Total parameters")
    max_position_embeddings: int = Field(
        ge=1, le=100_000_000, description="max_position_embeddings: the longest context"
    )
    tie_word_embeddings: bool = Field(False, description="lm_head shares the embedding matrix")
    sliding_window: int | None = Field(
        None, ge=1, le=100_000_000, description="Window of the sliding-window attention layers"
    )
    sliding_window_layers: int | None = Field(
        None, ge=0, le=1024, description="How many layers use the sliding window (the rest are full)"
    )
    kv_lora_rank: int | None = Field(
        None, ge=1, le=65536, description="MLA: compressed KV rank (DeepSeek kv_lora_rank)"
    )
    qk_rope_head_dim: int | None = Field(None, ge=0, le=65536, description="MLA: decoupled RoPE dims")
    num_nextn_predict_layers: int = Field(
        0, ge=0, le=16, description="Multi-token-prediction (MTP) layers shipped with the model"
    )
    num_experts: int | None = Field(None, ge=1, le=4096, description="MoE: routed experts per layer")
    num_experts_per_token: int | None = Field(None, ge=1, le=4096, description="MoE: experts per token")


TOKEN_SECRET_KEY = "token"
"""The key of a `tokenSecretRef` Secret that holds the Hugging Face token."""
HUB_TOKEN_ENV = "HF_TOKEN"
"""The variable the engines' Hugging Face client reads the token from (huggingface_hub `get_token`)."""


class ConfigSources(WireModel):
    """Where the operator finds a model's config.json besides the Hub and the catalog, and the token for a
    gated one: the same fields for the target and the draft."""

    config_map_ref: str | None = Field(
        None, min_length=1, max_length=253,
        description="ConfigMap in this namespace whose key config.json holds the model's config.json",
    )
    config_path: str | None = Field(
        None, min_length=1, max_length=1024,
        description="config.json, or the directory holding it, in the engine's model volume",
    )
    token_secret_ref: str | None = Field(
        None, min_length=1, max_length=253,
        description="Secret in this namespace whose key token holds a Hugging Face token for a gated or private "
        "model (never shown): the operator reads config.json with it, and the engine pods get it as HF_TOKEN "
        "(a secretKeyRef, never the value)",
    )


class Model(ConfigSources):
    """The target model: the one whose outputs users get."""

    name: str = Field(
        min_length=1, max_length=256, description="Hugging Face id or path, e.g. meta-llama/Llama-3.1-8B-Instruct"
    )
    quantization: Quantization = Field(
        Quantization.NONE, description="Weight quantisation: none (checkpoint dtype), fp8, int8, awq, gptq, int4"
    )
    dtype: Dtype = Field(Dtype.BFLOAT16, description="Activation and unquantised weight dtype")
    revision: str | None = Field(None, max_length=128, description="Model revision (branch, tag, commit)")
    base_model: str | None = Field(
        None, min_length=1, max_length=256,
        description="Hugging Face id of the model whose weights `name` holds, quantised or copied (a local path or "
        "a mirror of meta-llama/Llama-3.3-70B-Instruct): an EAGLE head trained for that model pairs with this one, "
        "and the built-in catalog describes it when nothing else does",
    )
    architecture: Architecture | None = Field(
        None, description="The model's numbers; they win over every config.json. Needed only when no "
        "configMapRef, configPath, Hugging Face Hub or built-in catalog entry describes the model"
    )


class Draft(ConfigSources):
    """The draft model or EAGLE head that proposes tokens for the target to verify."""

    name: str = Field(min_length=1, max_length=256, description="Hugging Face id or path of the draft")
    quantization: Quantization = Field(Quantization.NONE, description="Draft weight quantisation")
    revision: str | None = Field(None, max_length=128, description="Draft revision")
    tensor_parallel_size: int | None = Field(
        None, ge=1, le=64, description="Draft tensor parallelism: 1 or the target's (vLLM draft_tensor_parallel_size)"
    )
    architecture: Architecture | None = Field(
        None, description="The draft's numbers; they win over every config.json. Needed only when no "
        "configMapRef, configPath, Hugging Face Hub or built-in catalog entry describes the draft"
    )


def _without_nulls(value: JsonValue) -> JsonValue:
    """`value` with every null member of an object dropped, as `parse_resource` reads a document: a null
    means "the engine's default", so the operator renders the same config from the apiserver's copy (which
    keeps nulls inside free-form JSON) as `specdeploy plan` does from the file."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _managed_key_properties() -> dict[str, Any]:
    """The managed keys as declared properties of `extraConfig`: CEL sees only the declared properties of an
    object that keeps unknown fields, so the rules that refuse these keys need them declared."""
    properties: dict[str, Any] = {}
    for engine, keys in MANAGED_KEYS.items():
        for key, managed in keys.items():
            properties[key] = {
                "type": managed.json_type,
                "description": f"Refused with `spec.engine.kind` {engine}: the operator renders it from "
                               f"`{managed.owner}`; set that instead",
            }
    return properties


MAX_SCHEDULE_RANGES = 64
"""Ranges of `spec.speculation.schedule.table`: bounds the CRD's CEL cost; a schedule needs a handful."""


class ScheduleRange(WireModel):
    """k drafted tokens for every batch size from minBatch to maxBatch, both included."""

    min_batch: int = Field(ge=1, le=100_000, description="Smallest batch size (running sequences) of the range")
    max_batch: int = Field(ge=1, le=100_000, description="Largest batch size of the range, included")
    k: int = Field(ge=0, le=16, description="Tokens drafted per step in this range; 0 drafts nothing")

    cel_rules = (
        CelRule(
            "self.minBatch <= self.maxBatch",
            "`spec.speculation.schedule.table[].minBatch` must not be greater than its `maxBatch`: a range is "
            "minBatch to maxBatch, both included",
            lambda r: r.min_batch <= r.max_batch,
        ),
    )


def _contiguous(table: list[ScheduleRange]) -> bool:
    """The first range starts at 1 and each one starts right after the one before it."""
    return all(r.min_batch == (table[i - 1].max_batch + 1 if i else 1) for i, r in enumerate(table))


class Schedule(WireModel):
    """How many tokens are drafted at each batch size, read by the engine every step without a restart."""

    mode: ScheduleMode = Field(
        ScheduleMode.FIXED,
        description="Fixed: numSpeculativeTokens at every batch size. Auto: the operator derives k per batch range "
        "from its speedup model, 0 where speculation stops paying. Table: the ranges in `table`",
    )
    table: list[ScheduleRange] | None = Field(
        None, max_length=MAX_SCHEDULE_RANGES,
        description="Mode Table only: batch ranges in ascending order, the first from 1, each starting right after "
        "the one before; the last range's k holds up to `spec.serving.maxNumSeqs`",
    )

    cel_rules = (
        CelRule(
            "self.mode != 'Table' || (has(self.table) && size(self.table) > 0)",
            "`spec.speculation.schedule.table` is required when `spec.speculation.schedule.mode` is Table: list "
            "the batch ranges and their k, or use mode Auto",
            lambda s: s.mode != ScheduleMode.TABLE or bool(s.table),
        ),
        CelRule(
            "self.mode == 'Table' || !has(self.table)",
            "`spec.speculation.schedule.table` must not be set unless `spec.speculation.schedule.mode` is Table: "
            "Fixed and Auto do not read it; set mode Table or remove the table",
            lambda s: s.mode == ScheduleMode.TABLE or s.table is None,
        ),
        CelRule(
            "!has(self.table) || size(self.table) == 0 || (self.table.map(r, r.minBatch).isSorted()"
            " && self.table.exists(r, r.minBatch == 1)"
            " && self.table.all(r, self.table.exists_one(o, o.minBatch == r.minBatch))"
            " && self.table.all(r, r.minBatch == 1 || self.table.exists(o, o.maxBatch + 1 == r.minBatch)))",
            "`spec.speculation.schedule.table` must list its ranges in ascending order without gaps or overlaps: "
            "the first minBatch 1, each next minBatch one more than the maxBatch before it",
            lambda s: not s.table or _contiguous(s.table),
        ),
        CelRule(
            "!has(self.table) || size(self.table) == 0 || self.table.exists(r, r.k > 0)",
            "`spec.speculation.schedule.table` must draft in at least one range (k greater than 0): a table of "
            "zeros drafts nothing and still pays for speculation; set `spec.speculation.enabled` to false instead",
            lambda s: not s.table or any(r.k > 0 for r in s.table),
        ),
    )


class Speculation(WireModel):
    """How tokens are proposed. Rollback turns it off in status, never here."""

    enabled: bool = Field(True, description="false renders the same target without speculation")
    method: Method | None = Field(
        None, description="draft_model, eagle, eagle3, mtp, ngram, suffix, dflash, dspark or ngram_gpu; required "
        "unless enabled is false"
    )
    draft: Draft | None = Field(
        None, description="Required for draft_model, eagle, eagle3, dflash and dspark; forbidden otherwise"
    )
    num_speculative_tokens: int = Field(
        3, description="Tokens proposed per step (k), 1 to 16; with a schedule, the most any batch size may draft"
    )
    schedule: Schedule | None = Field(
        None,
        description="k per batch size: mode Fixed (numSpeculativeTokens always; also when empty), Auto (derived "
        "by the operator) or Table (docs/schedules.md)",
    )
    prompt_lookup_min: int = Field(
        2, ge=1, le=64, description="ngram and ngram_gpu: shortest n-gram matched in the prompt"
    )
    prompt_lookup_max: int = Field(
        5, ge=1, le=64, description="ngram and ngram_gpu: longest n-gram matched in the prompt"
    )
    eagle_topk: int = Field(
        1, ge=1, le=64, description="SGLang: branching per draft step; >1 turns the overlap scheduler off"
    )
    num_draft_tokens: int | None = Field(
        None, ge=2, le=1024,
        description="SGLang with eagleTopk > 1: tokens of the draft tree verified per sequence each step, root "
        "included (--speculative-num-draft-tokens); 1 + numSpeculativeTokens × eagleTopk when empty. The plan "
        "prices the verify pass at this many tokens",
    )
    extra_config: dict[str, JsonValue] | None = Field(
        None, max_length=MAX_EXTRA_CONFIG_KEYS,
        description="Engine speculative-config keys the fields above do not cover (any JSON values), merged into "
        "vLLM's --speculative-config JSON or TensorRT-LLM's speculative_config YAML, e.g. "
        "{disable_padded_drafter_batch: true}. Keys the operator renders from the fields above are refused; a key "
        "the engine's config does not have, more than "
        f"{MAX_EXTRA_CONFIG_TEXT} characters of JSON, or any key with sglang (which has no speculative config "
        "object) is refused by the plan (docs/compatibility.md)",
        json_schema_extra={"properties": _managed_key_properties()},
    )

    @field_validator("extra_config")
    @classmethod
    def _drop_nulls(cls, value: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        return None if value is None else {key: _without_nulls(item) for key, item in value.items()
                                           if item is not None}

    @property
    def schedule_mode(self) -> ScheduleMode:
        """The schedule's mode; Fixed when no schedule is written (so an older resource hashes as before)."""
        return self.schedule.mode if self.schedule is not None else ScheduleMode.FIXED

    def tree_draft_tokens(self, steps: int) -> int | None:
        """Tokens SGLang verifies per sequence each step for a draft tree (eagleTopk > 1) drafting `steps` deep, root
        included: numDraftTokens, or 1 + steps × eagleTopk (every draft step can add eagleTopk candidates). None for a
        chain (eagleTopk 1), where SGLang forces steps + 1 itself."""
        if self.eagle_topk == 1:
            return None
        return self.num_draft_tokens if self.num_draft_tokens is not None else 1 + steps * self.eagle_topk

    @property
    def enabled_method(self) -> Method:
        """The method, for code that runs only for enabled speculation (rendering it, costing it): the rule
        `!enabled || has(method)` makes it present there."""
        if self.method is None:
            raise ValueError("`spec.speculation.method` is not set, so there is no speculation to render or cost")
        return self.method

    cel_rules = (
        CelRule(
            "!self.enabled || has(self.method)",
            "`spec.speculation.method` is required while `spec.speculation.enabled` is true: name how tokens are "
            "proposed (draft_model, eagle, eagle3, mtp, ngram, suffix, dflash, dspark or ngram_gpu), or set enabled to "
            "false",
            lambda s: not s.enabled or s.method is not None,
        ),
        CelRule(
            f"!has(self.method) || !(self.method in {_cel_list(METHODS_WITH_DRAFT)}) || has(self.draft)",
            f"`spec.speculation.draft` is required when `spec.speculation.method` is {_words(METHODS_WITH_DRAFT)}: "
            "name the draft model or EAGLE head",
            lambda s: s.method not in METHODS_WITH_DRAFT or s.draft is not None,
        ),
        CelRule(
            f"!has(self.method) || !(self.method in {_cel_list(METHODS_WITHOUT_DRAFT)}) || !has(self.draft)",
            f"`spec.speculation.draft` must not be set when `spec.speculation.method` is "
            f"{_words(METHODS_WITHOUT_DRAFT)}: these methods draft without a separate model; remove it",
            lambda s: s.method not in METHODS_WITHOUT_DRAFT or s.draft is None,
        ),
        CelRule(
            "self.numSpeculativeTokens >= 1 && self.numSpeculativeTokens <= 16",
            "`spec.speculation.numSpeculativeTokens` must be at least 1 and at most 16",
            lambda s: 1 <= s.num_speculative_tokens <= 16,
        ),
        CelRule(
            "!has(self.schedule) || !has(self.schedule.table) || "
            "self.schedule.table.all(r, r.k <= self.numSpeculativeTokens)",
            "`spec.speculation.schedule.table[].k` must not be greater than `spec.speculation.numSpeculativeTokens`: "
            "the engine reserves memory for numSpeculativeTokens and drafts no more; raise it or lower the k",
            lambda s: s.schedule is None or all(r.k <= s.num_speculative_tokens for r in s.schedule.table or ()),
        ),
        CelRule(
            "!has(self.numDraftTokens) || self.eagleTopk > 1",
            "`spec.speculation.numDraftTokens` needs `spec.speculation.eagleTopk` above 1: a chain (eagleTopk 1) "
            "verifies numSpeculativeTokens + 1 tokens, which SGLang sets itself; remove it or widen the tree",
            lambda s: s.num_draft_tokens is None or s.eagle_topk > 1,
        ),
        CelRule(
            "self.promptLookupMin <= self.promptLookupMax",
            "`spec.speculation.promptLookupMin` must not be greater than `spec.speculation.promptLookupMax`",
            lambda s: s.prompt_lookup_min <= s.prompt_lookup_max,
        ),
    )


class Gpu(WireModel):
    """The GPUs of one pod."""

    product: str = Field(
        "H100-80GB", max_length=128, description="GPU product, e.g. H100-80GB, H200, A100-80GB, L40S; selects nodes"
    )
    memory_gib: MemoryGiB | None = Field(
        None, description="Memory per GPU (80 or 80Gi); from the product table when empty"
    )
    count: int | None = Field(
        None, ge=1, le=64, description="GPUs per pod; tensorParallelSize × pipelineParallelSize, at most a node's, when empty"
    )
    per_node: int | None = Field(
        None, ge=1, le=64,
        description="GPUs of one node; from the product when empty (8 on the HGX/DGX boards); a layout needing more "
                    "spans nodes",
    )


class Resources(WireModel):
    """GPUs per pod and how the engine uses them."""

    gpu: Gpu = Field(default_factory=Gpu, description="GPU product, memory and count per pod")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="Tensor parallelism: GPUs one model is split over")
    pipeline_parallel_size: int = Field(
        1, ge=1, le=16,
        description="Pipeline stages the model's layers are split over, each tensorParallelSize GPUs; a layout of more "
                    "GPUs than a node holds runs as a LeaderWorkerSet across nodes",
    )
    gpu_memory_utilization: float = Field(
        0.9, description="Fraction of each GPU's memory the engine may use, greater than 0 and at most 1"
    )

    cel_rules = (
        CelRule(
            "self.gpuMemoryUtilization > 0.0 && self.gpuMemoryUtilization <= 1.0",
            "`spec.resources.gpuMemoryUtilization` must be greater than 0 and at most 1",
            lambda r: 0.0 < r.gpu_memory_utilization <= 1.0,
        ),
        CelRule(
            "!has(self.gpu.count) || self.tensorParallelSize <= self.gpu.count",
            "`spec.resources.tensorParallelSize` must not be greater than `spec.resources.gpu.count`: "
            "a pod needs one GPU per tensor-parallel rank",
            lambda r: r.gpu.count is None or r.tensor_parallel_size <= r.gpu.count,
        ),
    )

    @property
    def gpu_count(self) -> int:
        """GPUs of one replica on one node: `gpu.count`, else every rank of the layout (a layout that spans nodes
        is split into pods of one node each by planning.topology.node_layout)."""
        return self.gpu.count if self.gpu.count is not None else self.tensor_parallel_size * self.pipeline_parallel_size


class Serving(WireModel):
    """Engine scheduling limits; they decide the KV cache the plan needs."""

    max_model_len: int | None = Field(
        None, ge=16, le=100_000_000, description="Longest prompt + output; the model's maximum when empty"
    )
    max_num_seqs: int = Field(256, ge=1, le=100_000, description="Most sequences in one batch")
    max_num_batched_tokens: int = Field(
        8192, ge=16, le=10_000_000, description="Most tokens in one forward pass (sets the activation peak)"
    )
    kv_cache_dtype: KvCacheDtype = Field(KvCacheDtype.AUTO, description="KV cache dtype: auto (model dtype) or fp8")
    kv_cache_memory_gib: MemoryGiB | None = Field(
        None,
        description="vLLM --kv-cache-memory: a fixed KV cache size per GPU instead of the utilisation budget",
    )
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the OpenAI-compatible server")

    cel_rules = (
        CelRule(
            "self.maxNumBatchedTokens >= self.maxNumSeqs",
            "`spec.serving.maxNumBatchedTokens` must be at least `spec.serving.maxNumSeqs`: every running "
            "sequence needs one token per step",
            lambda s: s.max_num_batched_tokens >= s.max_num_seqs,
        ),
    )


class PrometheusSource(WireModel):
    url: str | None = Field(
        None, max_length=2048,
        description="Prometheus base URL, e.g. http://prometheus.monitoring:9090; the operator's --prometheus-url "
        "when empty",
    )
    headers_secret_ref: str | None = Field(
        None, max_length=253,
        description="Secret in this namespace, labelled specdeploy.io/headers=true, whose keys are HTTP headers "
        "sent to Prometheus (e.g. Authorization, X-Scope-OrgID)",
    )


class Baseline(WireModel):
    mode: BaselineMode = Field(
        BaselineMode.CONTROL,
        description="Control: compare with controlReplicas pods without speculation behind the same Service; "
        "Previous: with what the pods measured before speculation; None: absolute checks only",
    )
    control_replicas: int = Field(1, ge=0, le=1000, description="Pods without speculation when mode is Control")

    cel_rules = (
        CelRule(
            "self.mode != 'Control' || self.controlReplicas >= 1",
            "`spec.analysis.baseline.controlReplicas` must be at least 1 when `spec.analysis.baseline.mode` is Control",
            lambda b: b.mode != BaselineMode.CONTROL or b.control_replicas >= 1,
        ),
    )


class Checks(WireModel):
    """Limits a sample must stay within; breaking one makes the sample Failing."""

    min_acceptance_rate: float | None = Field(
        None, ge=0, le=1,
        description="Lowest accepted ÷ drafted tokens before speculation counts as failing; unset (Auto): the "
        "break-even acceptance of the cost model for the method, k, the draft's cost and the pods' batch size, "
        "plus a margin",
    )
    max_per_token_latency_ratio: float | None = Field(
        None, gt=0, le=1000,
        description="Highest mean per-token latency (time per output token), speculative ÷ baseline, held by the "
        "comparison's 95% interval; objectives Latency and Both. Unset: the deprecated "
        "maxP99InterTokenLatencyRatio, else 1.10",
    )
    max_inference_time_ratio: float | None = Field(
        None, gt=0, le=1000,
        description="Highest mean end-to-end latency without the queue (vLLM's request_inference_time: scheduled "
        "to last token), speculative ÷ baseline, held by the comparison's 95% interval; objectives Latency and "
        "Both. Queueing is the Throughput objective's. Unset: the deprecated maxP99E2ELatencyRatio, else 1.20",
    )
    max_prefill_time_ratio: float | None = Field(
        None, gt=0, le=1000,
        description="Highest mean time to first token without the queue (vLLM's request_prefill_time: scheduled "
        "to first token), speculative ÷ baseline, each at least prefillTimeFloorSeconds, held by the comparison's "
        "95% interval; objectives Latency and Both. Unset: the deprecated maxP99TimeToFirstTokenRatio, else 1.50",
    )
    prefill_time_floor_seconds: float = Field(
        0.1, ge=0, le=3600,
        description="Mean time to first token without the queue counted as this much when it is less: a drafter's "
        "own prefill adds a few to tens of milliseconds to short prompts, a large ratio of times no user feels, so "
        "two variants that both prefill faster never fail maxPrefillTimeRatio; 0 compares the times as measured",
    )
    max_p99_inter_token_latency_ratio: float | None = Field(
        None, gt=0, le=1000,
        description="Deprecated: the old name of maxPerTokenLatencyRatio (the check compares means, not P99); "
        "ignored when that is set",
    )
    max_p99_e2e_latency_ratio: float | None = Field(
        None, gt=0, le=1000,
        description="Deprecated: the old name of maxInferenceTimeRatio (the check compares means of the time "
        "without the queue, not P99); ignored when that is set",
    )
    max_p99_time_to_first_token_ratio: float | None = Field(
        None, gt=0, le=1000,
        description="Deprecated: the old name of maxPrefillTimeRatio (the check compares means of the time "
        "without the queue, not P99); ignored when that is set",
    )
    max_p99_e2e_latency_seconds: float | None = Field(
        None, gt=0, le=86400,
        description="Absolute P99 end-to-end latency SLO in seconds, queue included (what clients see); every "
        "objective",
    )
    max_queue_time_ratio: float = Field(
        2.0, gt=0, le=1000,
        description="Highest mean queue time, speculative ÷ control, each at least queueTimeFloorSeconds; "
        "objectives Throughput and Both",
    )
    queue_time_floor_seconds: float = Field(
        0.05, ge=0, le=3600,
        description="Mean queue time counted as this much when it is less: queueing below it is noise, so two "
        "variants that both queue less never fail maxQueueTimeRatio",
    )
    min_output_tokens_per_gpu_ratio: float = Field(
        0.90, ge=0, le=1000,
        description="Lowest output tokens per second per GPU, speculative ÷ control, at the same offered load; "
        "objectives Throughput and Both",
    )
    rollback_on_oom: bool = Field(True, alias="rollbackOnOOM", description="Roll back at once when a speculative pod runs out of memory")

    @property
    def per_token_latency_ratio(self) -> float:
        """The per-token limit in force: the new name, else its deprecated alias, else the default."""
        return _first(self.max_per_token_latency_ratio, self.max_p99_inter_token_latency_ratio, 1.10)

    @property
    def inference_time_ratio(self) -> float:
        return _first(self.max_inference_time_ratio, self.max_p99_e2e_latency_ratio, 1.20)

    @property
    def prefill_time_ratio(self) -> float:
        return _first(self.max_prefill_time_ratio, self.max_p99_time_to_first_token_ratio, 1.50)

    def deprecated_names(self) -> list[str]:
        """A sentence per deprecated name set, with what to write instead (a warning in status)."""
        said = []
        for old, new, old_value, new_value in (
                ("maxP99InterTokenLatencyRatio", "maxPerTokenLatencyRatio", self.max_p99_inter_token_latency_ratio,
                 self.max_per_token_latency_ratio),
                ("maxP99E2ELatencyRatio", "maxInferenceTimeRatio", self.max_p99_e2e_latency_ratio,
                 self.max_inference_time_ratio),
                ("maxP99TimeToFirstTokenRatio", "maxPrefillTimeRatio", self.max_p99_time_to_first_token_ratio,
                 self.max_prefill_time_ratio)):
            if old_value is None:
                continue
            if new_value is None:
                said.append(f"`spec.analysis.checks.{old}` is deprecated (the check compares means): rename it "
                            f"{new}; {old_value} is used")
            else:
                said.append(f"`spec.analysis.checks.{old}` is deprecated and ignored: {new} {new_value} is "
                            f"used; remove {old}")
        return said


def _first(*values: float | None) -> float:
    return next(value for value in values if value is not None)


class Probe(WireModel):
    """The operator's own probe of the speculative pods: acceptance per workload and temperature
    (docs/analysis.md "Measure first"). Its failures are the Probed condition, never a rollback."""

    interval: Duration | None = Field(
        None, description="Probe again this long after the last probe, e.g. 6h; unset: only a new generation"
    )
    on_new_generation: bool = Field(
        True, description="Probe each new speculative generation (new engine pods) once it is available"
    )
    temperatures: list[float] = Field(
        default_factory=lambda: [0.0, 0.7, 1.0], min_length=1, max_length=8,
        description="Sampling temperatures, each 0 to 2",
    )
    workloads_config_map: str | None = Field(
        None, max_length=253,
        description="ConfigMap in this namespace: each key a workload name (code, support, …), each value a YAML "
        "list of prompts. Unset: a built-in neutral prompt set",
    )
    requests_per_cell: int = Field(8, ge=1, le=100, description="Requests per workload × temperature")
    max_tokens: int = Field(64, ge=1, le=1024, description="Output tokens asked per request")
    requests_per_second: float = Field(
        1.0, gt=0, le=10, description="The most probe requests per second, sent one at a time"
    )
    timeout: Duration = Field(600.0, description="A probe stops after this long, e.g. 10m; what it measured counts")

    cel_rules = (
        CelRule(
            "self.temperatures.all(t, t >= 0.0 && t <= 2.0)",
            "`spec.analysis.probe.temperatures` must each be at least 0 and at most 2",
            lambda p: all(0.0 <= t <= 2.0 for t in p.temperatures),
        ),
        CelRule(
            "!has(self.interval) || duration(self.interval) >= duration('10m')",
            "`spec.analysis.probe.interval` must be at least 10m: each probe takes requests from serving",
            lambda p: p.interval is None or p.interval >= 600.0,
        ),
        CelRule(
            "duration(self.timeout) >= duration('10s') && duration(self.timeout) <= duration('1h')",
            "`spec.analysis.probe.timeout` must be at least 10s and at most 1h",
            lambda p: 10.0 <= p.timeout <= 3600.0,
        ),
    )


class Analysis(WireModel):
    """How Prometheus is read and when speculation is taken away."""

    prometheus: PrometheusSource = Field(default_factory=PrometheusSource, description="Where metrics are")
    interval: Duration = Field(30.0, description="Time between samples, e.g. 30s")
    window: Duration = Field(300.0, description="Range each sample covers, e.g. 5m")
    min_requests: int = Field(
        20, ge=0, le=10_000_000, description="Below this many requests in the window a sample is inconclusive"
    )
    failure_limit: int = Field(3, ge=1, le=1000, description="Consecutive failing samples before rollback")
    on_inconclusive: OnInconclusive = Field(
        OnInconclusive.HOLD, description="Hold keeps speculation; Rollback rolls back after inconclusiveLimit"
    )
    inconclusive_limit: int = Field(20, ge=1, le=100_000, description="Consecutive inconclusive samples tolerated")
    baseline: Baseline = Field(default_factory=Baseline, description="What speculation is compared with")
    objective: Objective = Field(
        Objective.LATENCY,
        description="What speculation is judged by. Latency: per-token latency and the time a request spends in "
        "the engine (queue left out), against the baseline. Throughput: the load it sustains, queue time and "
        "output tokens per second per GPU against the control, per-token latency not counted. Both: both sets",
    )
    checks: Checks = Field(default_factory=Checks, description="Limits of a healthy sample")
    probe: Probe | None = Field(
        None, description="The operator probes the speculative pods itself, on a new generation and every interval"
    )
    cooldown: Duration = Field(1800.0, description="Wait after a rollback before Auto re-enables, e.g. 30m")
    reenable: Reenable = Field(
        Reenable.MANUAL, description="Manual: a spec change or the retry annotation; Auto: after cooldown, doubling"
    )
    mode: AnalysisMode = Field(
        AnalysisMode.ACT,
        description="Act: the judgment rolls speculation back. Observe: it judges and says what it would do "
        "(status, the specdeploy_would_rollbacks_total metric, specdeploy_verdict and the alerts labelled "
        "observe=\"true\") and rolls nothing back; failures counted under Observe count when it becomes Act",
    )

    cel_rules = (
        CelRule(
            "duration(self.interval) >= duration('1s')",
            "`spec.analysis.interval` must be at least 1s",
            lambda a: a.interval >= 1.0,
        ),
        CelRule(
            "duration(self.window) >= duration(self.interval)",
            "`spec.analysis.window` must not be shorter than `spec.analysis.interval`",
            lambda a: a.window >= a.interval,
        ),
        CelRule(
            "self.objective == 'Latency' || self.baseline.mode == 'Control'",
            "`spec.analysis.objective` Throughput and Both compare queueing and tokens per GPU with the control "
            "pods at the same load, so they need `spec.analysis.baseline.mode` Control; set it, or use objective "
            "Latency",
            lambda a: a.objective == Objective.LATENCY or a.baseline.mode == BaselineMode.CONTROL,
        ),
    )


class Alerting(WireModel):
    alertmanager_url: str | None = Field(
        None, max_length=2048,
        description="Alertmanager base URL; rollbacks raise an alert there. The operator's --alertmanager-url when "
        "empty; no alert when both are empty",
    )
    headers_secret_ref: str | None = Field(
        None, max_length=253,
        description="Secret in this namespace, labelled specdeploy.io/headers=true, whose keys are HTTP headers "
        "sent to Alertmanager (e.g. Authorization)",
    )


class Rollout(WireModel):
    """How the engine Deployments replace their pods, a rollback included. The default needs no spare GPU:
    GPU clusters are usually full, and a rollback that waits for a free GPU never happens
    (docs/decisions.md)."""

    max_surge: int = Field(
        0, ge=0, le=10_000, description="Pods a rollout may start above the replicas; each needs free GPUs"
    )
    max_unavailable: int = Field(
        1, ge=0, le=10_000, description="Pods a rollout may stop before their replacements are ready"
    )

    cel_rules = (
        CelRule(
            "self.maxSurge + self.maxUnavailable >= 1",
            "`spec.rollout.maxSurge` and `spec.rollout.maxUnavailable` must not both be 0: a rollout could "
            "neither add a pod nor stop one; keep maxUnavailable 1 for a cluster without spare GPUs",
            lambda s: s.max_surge + s.max_unavailable >= 1,
        ),
    )


MODEL_CACHE_PATH = "/model-cache"
"""Where the engine container mounts `spec.storage.modelCache`; the engines download under it (HF_HOME)."""


class ClaimCache(WireModel):
    """A PersistentVolumeClaim every pod of the SD mounts: ReadWriteMany (the first pod downloads, the others
    read) or ReadOnlyMany filled beforehand."""

    claim_name: str = Field(min_length=1, max_length=253, description="The claim, in the SD's namespace")
    read_only: bool = Field(
        False, description="Mount it read-only and keep the engines offline (HF_HUB_OFFLINE=1): the claim holds "
        "every model at its revision already (ReadOnlyMany)",
    )


class HostPathCache(WireModel):
    """A directory on each node: the pods of a node share it, and a pod on another node downloads again."""

    path: str = Field(
        min_length=2, max_length=4096, pattern="^/",
        description="Absolute directory on the node, created when missing; it must be writable by uid 65532",
    )


class EmptyDirCache(WireModel):
    """Per pod, gone with it: every new pod downloads again."""

    size_limit: MemoryGiB | None = Field(
        None, description="The kubelet evicts a pod whose cache grows past it; unset: twice the plan's weights "
        "+ 5Gi (docs/operator.md \"Weight cache\")",
    )


class ModelCache(WireModel):
    """Where the engines keep the weights they download: one of persistentVolumeClaim, hostPath, emptyDir."""

    persistent_volume_claim: ClaimCache | None = Field(None, description="Shared by every pod of the SD")
    host_path: HostPathCache | None = Field(None, description="Shared by the pods of each node")
    empty_dir: EmptyDirCache | None = Field(None, description="Per pod, bounded (the default)")

    cel_rules = (
        CelRule(
            "(has(self.persistentVolumeClaim) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) + (has(self.emptyDir) ? 1 : 0)"
            " <= 1",
            "`spec.storage.modelCache` must set at most one of persistentVolumeClaim, hostPath and emptyDir: the "
            "engines download into one place",
            lambda c: sum(x is not None for x in (c.persistent_volume_claim, c.host_path, c.empty_dir)) <= 1,
        ),
    )


class Storage(WireModel):
    """Storage of the engine pods."""

    model_cache: ModelCache = Field(
        default_factory=ModelCache,
        description="Where the weights are downloaded to and found again by the next pod: a rollback's, a "
        "re-enable's, a rescheduled one's",
    )


OPERATOR_POD_LABELS = (
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component", "specdeploy.io/name", "specdeploy.io/variant",
)
"""Labels the operator puts on every engine pod: its Deployments' selectors and the Service's are made of them."""
OPERATOR_POD_ANNOTATIONS = ("specdeploy.io/config-hash",)
OPERATOR_NODE_SELECTOR = "nvidia.com/gpu.product"
OPERATOR_VOLUMES = ("engine-config", "dshm", "home", "tmp", "model-cache")
OPERATOR_MOUNT_PATHS = ("/etc/specdeploy", "/dev/shm", "/home/engine", "/tmp", MODEL_CACHE_PATH)
OPERATOR_RESOURCE = "nvidia.com/gpu"
MAX_POD_ITEMS = 64
"""Entries of each list and map of `spec.podTemplate`: bounds the CEL rules' cost; a pod needs a handful."""


def _none_of(expression: str, values: tuple[str, ...]) -> str:
    return f"!({expression} in [{', '.join(repr(v) for v in values)}])"


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(values)


class PodMetadata(WireModel):
    """Labels and annotations added to the engine pods (a service mesh's, a cost tool's)."""

    labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=MAX_POD_ITEMS, description="Added to the operator's own pod labels"
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_POD_ITEMS, description="Added to the operator's own pod annotations"
    )

    cel_rules = (
        CelRule(
            " && ".join(f"!('{key}' in self.labels)" for key in OPERATOR_POD_LABELS),
            f"`spec.podTemplate.metadata.labels` must not set {_quoted(OPERATOR_POD_LABELS)}: the operator sets them "
            "and selects its pods by them",
            lambda m: not set(m.labels) & set(OPERATOR_POD_LABELS),
        ),
        CelRule(
            " && ".join(f"!('{key}' in self.annotations)" for key in OPERATOR_POD_ANNOTATIONS),
            f"`spec.podTemplate.metadata.annotations` must not set {_quoted(OPERATOR_POD_ANNOTATIONS)}: the operator "
            "sets it to restart the pods when their configuration changes",
            lambda m: not set(m.annotations) & set(OPERATOR_POD_ANNOTATIONS),
        ),
    )


class PodSettings(WireModel):
    """Pod fields platform teams set, as in a Pod's spec, merged with what the operator renders."""

    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=MAX_POD_ITEMS,
        description=f"Added to the operator's {OPERATOR_NODE_SELECTOR} (from `spec.resources.gpu.product`)",
    )
    tolerations: list[kube.Toleration] = Field(
        default_factory=list, max_length=MAX_POD_ITEMS,
        description=f"Added to the operator's toleration of {OPERATOR_RESOURCE} taints",
    )
    affinity: kube.Affinity | None = Field(
        None, description=f"{kube.UPSTREAM_DESCRIPTION} Affinity: node and pod affinity, as in a Pod"
    )
    priority_class_name: str | None = Field(None, max_length=253, description="The pods' PriorityClass")
    image_pull_secrets: list[kube.LocalObjectReference] = Field(
        default_factory=list, max_length=MAX_POD_ITEMS, description="Secrets for pulling the engine image"
    )
    service_account_name: str | None = Field(
        None, max_length=253,
        description="The pods' ServiceAccount (e.g. for workload identity); its API token is still not mounted",
    )
    runtime_class_name: str | None = Field(None, max_length=253, description="The pods' RuntimeClass")
    volumes: list[kube.Volume] = Field(
        default_factory=list, max_length=MAX_POD_ITEMS,
        description=f"Added to the operator's volumes ({_quoted(OPERATOR_VOLUMES)}); mount them with "
        "`spec.podTemplate.engineContainer.volumeMounts`",
    )

    cel_rules = (
        CelRule(
            f"!('{OPERATOR_NODE_SELECTOR}' in self.nodeSelector)",
            f"`spec.podTemplate.spec.nodeSelector` must not set {OPERATOR_NODE_SELECTOR}: the operator sets it from "
            "`spec.resources.gpu.product`; set that instead",
            lambda p: OPERATOR_NODE_SELECTOR not in p.node_selector,
        ),
        CelRule(
            f"self.volumes.all(v, {_none_of('v.name', OPERATOR_VOLUMES)})",
            f"`spec.podTemplate.spec.volumes` must not name a volume {_quoted(OPERATOR_VOLUMES)}: the operator's "
            "volumes have those names; choose another name",
            lambda p: all(v.get("name") not in OPERATOR_VOLUMES for v in p.volumes),
        ),
        CelRule(
            "self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
            "`spec.podTemplate.spec.volumes` must not name two volumes alike: a Pod's volumes are keyed by name",
            lambda p: len({v.get("name") for v in p.volumes}) == len(p.volumes),
        ),
    )


class EngineContainer(WireModel):
    """Settings of the engine container, merged with what the operator renders; its GPU request, probes,
    security context, command and arguments stay the operator's."""

    resources: kube.ResourceRequirements | None = Field(
        None,
        description=f"{kube.UPSTREAM_DESCRIPTION} ResourceRequirements: CPU, memory and ephemeral-storage requests "
        "and limits. A resource set here replaces the "
        "operator's default request for it (docs/operator.md \"Pod settings\"); the GPUs are "
        "`spec.resources.gpu`",
    )
    env: list[kube.EnvVar] = Field(
        default_factory=list, max_length=MAX_POD_ITEMS,
        description="Environment from Secrets, ConfigMaps or the downward API (valueFrom), after the operator's "
        "and `spec.engine.env`",
    )
    volume_mounts: list[kube.VolumeMount] = Field(
        default_factory=list, max_length=MAX_POD_ITEMS,
        description="Mounts of `spec.podTemplate.spec.volumes` (or the operator's) into the engine container",
    )

    cel_rules = (
        CelRule(
            f"!has(self.resources) || ((!has(self.resources.limits) || !('{OPERATOR_RESOURCE}' in "
            f"self.resources.limits)) && (!has(self.resources.requests) || !('{OPERATOR_RESOURCE}' in "
            "self.resources.requests)))",
            f"`spec.podTemplate.engineContainer.resources` must not set {OPERATOR_RESOURCE}: the operator requests "
            "`spec.resources.gpu.count` GPUs (tensorParallelSize when unset); set that instead",
            lambda c: not any(OPERATOR_RESOURCE in ((c.resources or {}).get(k) or {}) for k in ("limits", "requests")),
        ),
        CelRule(
            f"self.volumeMounts.all(m, {_none_of('m.mountPath', OPERATOR_MOUNT_PATHS)})",
            f"`spec.podTemplate.engineContainer.volumeMounts` must not mount at {_quoted(OPERATOR_MOUNT_PATHS)}: "
            "the operator mounts its own volumes there; choose another path",
            lambda c: all(m.get("mountPath") not in OPERATOR_MOUNT_PATHS for m in c.volume_mounts),
        ),
        CelRule(
            "self.env.all(e, self.env.exists_one(f, f.name == e.name))",
            "`spec.podTemplate.engineContainer.env` must not set a variable twice: a container's env is keyed by "
            "name",
            lambda c: len({v.get("name") for v in c.env}) == len(c.env),
        ),
    )


class PodTemplate(WireModel):
    """What platform teams set on the engine pods: labels, scheduling, pull secrets, volumes, the engine
    container's requests, env and mounts (docs/operator.md "Pod settings")."""

    metadata: PodMetadata = Field(default_factory=PodMetadata, description="Pod labels and annotations")
    spec: PodSettings = Field(default_factory=PodSettings, description="Pod scheduling, identity and volumes")
    engine_container: EngineContainer = Field(
        default_factory=EngineContainer, description="The engine container's resources, env and mounts"
    )


def _managed_keys_rule(engine: EngineKind) -> CelRule:
    """Refuses, for `engine`, the extraConfig keys the operator renders from typed fields."""
    keys: dict[str, ManagedKey] = MANAGED_KEYS[engine.value]
    present = " || ".join(f"has(self.speculation.extraConfig.{key})" for key in keys)
    owners = ", ".join(f"{key} (`{managed.owner}`)" for key, managed in keys.items())
    where = "vLLM's --speculative-config" if engine == EngineKind.VLLM else "TensorRT-LLM's speculative_config"
    return CelRule(
        f"self.engine.kind != '{engine.value}' || !has(self.speculation.extraConfig) || !({present})",
        f"`spec.speculation.extraConfig` must not set a key that the operator renders into {where} from a spec "
        f"field when `spec.engine.kind` is {engine.value}: {owners}; remove the key and set the field instead",
        lambda s: s.engine.kind != engine or not set(s.speculation.extra_config or {}) & set(keys),
    )


class SpeculativeDeploymentSpec(WireModel):
    """What the user wants: a target model served with speculative decoding."""

    replicas: int = Field(1, ge=0, le=10_000, description="Engine pods with speculation")
    engine: Engine = Field(default_factory=Engine, description="Inference engine")
    model: Model = Field(description="The target model")
    speculation: Speculation = Field(description="Speculative decoding settings")
    resources: Resources = Field(default_factory=Resources, description="GPUs per pod")
    serving: Serving = Field(default_factory=Serving, description="Engine scheduling limits")
    analysis: Analysis = Field(default_factory=Analysis, description="Metric analysis and rollback")
    alerting: Alerting = Field(default_factory=Alerting, description="Where rollback alerts go")
    rollout: Rollout = Field(
        default_factory=Rollout, description="How the engine pods are replaced: maxSurge 0, maxUnavailable 1 by default"
    )
    storage: Storage = Field(default_factory=Storage, description="The weight cache")
    pod_template: PodTemplate = Field(
        default_factory=PodTemplate,
        description="Labels, scheduling, volumes, requests and env the engine pods get beside the operator's",
    )

    cel_rules = (
        CelRule(
            "self.analysis.baseline.mode != 'Control' || self.replicas >= self.analysis.baseline.controlReplicas",
            "`spec.replicas` must be at least `spec.analysis.baseline.controlReplicas` when "
            "`spec.analysis.baseline.mode` is Control",
            lambda s: s.analysis.baseline.mode != BaselineMode.CONTROL
            or s.replicas >= s.analysis.baseline.control_replicas,
        ),
        CelRule(
            "!has(self.serving.kvCacheMemoryGiB) || self.engine.kind == 'vllm'",
            "`spec.serving.kvCacheMemoryGiB` is a vLLM setting (--kv-cache-memory) and must not be set for "
            "sglang or trtllm, which size the KV cache from `spec.resources.gpuMemoryUtilization`",
            lambda s: s.serving.kv_cache_memory_gib is None or s.engine.kind == EngineKind.VLLM,
        ),
        CelRule(
            f"!has(self.speculation.method) || !(self.speculation.method in {_cel_list(VLLM_ONLY_METHODS)}) "
            "|| self.engine.kind == 'vllm'",
            f"`spec.speculation.method` {_words(VLLM_ONLY_METHODS)} is supported by vllm only; use ngram with "
            "sglang or trtllm",
            lambda s: s.speculation.method not in VLLM_ONLY_METHODS or s.engine.kind == EngineKind.VLLM,
        ),
        CelRule(
            "!has(self.speculation.method) || !(self.speculation.method in ['dflash', 'dspark']) "
            "|| self.engine.kind != 'trtllm'",
            "`spec.speculation.method` dflash and dspark are not supported by trtllm: the TensorRT-LLM release the "
            "operator renders for has no DFlash or DSpark decoding_type; use vllm or sglang, or method eagle3",
            lambda s: s.speculation.method not in (Method.DFLASH, Method.DSPARK) or s.engine.kind != EngineKind.TRTLLM,
        ),
        CelRule(
            "!has(self.analysis.probe) || self.engine.kind == 'vllm'",
            "`spec.analysis.probe` needs each answer's own speculative counts, which only vLLM returns "
            "(--per-request-spec-decode-metrics); with sglang or trtllm run `specdeploy probe` on a pod that "
            "serves nothing else",
            lambda s: s.analysis.probe is None or s.engine.kind == EngineKind.VLLM,
        ),
        CelRule(
            "!has(self.model.tokenSecretRef) || !has(self.speculation.draft) "
            "|| !has(self.speculation.draft.tokenSecretRef) "
            "|| self.speculation.draft.tokenSecretRef == self.model.tokenSecretRef",
            "`spec.speculation.draft.tokenSecretRef` must be unset or name the same Secret as "
            "`spec.model.tokenSecretRef`: every engine downloads the target and the draft with one HF_TOKEN; use "
            "one Hugging Face token that may read both models",
            lambda s: s.speculation.draft is None or not (s.model.token_secret_ref and s.speculation.draft.token_secret_ref)
            or s.speculation.draft.token_secret_ref == s.model.token_secret_ref,
        ),
        CelRule(
            f"!(has(self.model.tokenSecretRef) || (has(self.speculation.draft) "
            f"&& has(self.speculation.draft.tokenSecretRef))) || !self.engine.env.exists(e, e.name == '{HUB_TOKEN_ENV}')",
            f"`spec.engine.env` must not set {HUB_TOKEN_ENV} when a `tokenSecretRef` is set: the operator sets it from "
            "that Secret; remove the variable (a token written in the spec is readable by anyone who can read the SD)",
            lambda s: s.hub_token_secret is None or all(e.name != HUB_TOKEN_ENV for e in s.engine.env),
        ),
        CelRule(
            "self.podTemplate.engineContainer.env.all(e, !self.engine.env.exists(f, f.name == e.name))",
            "`spec.podTemplate.engineContainer.env` must not set a variable that `spec.engine.env` sets: one "
            "variable, one writer; keep it in one of them",
            lambda s: not {v.get("name") for v in s.pod_template.engine_container.env} & {e.name for e in s.engine.env},
        ),
        CelRule(
            f"!(has(self.model.tokenSecretRef) || (has(self.speculation.draft) "
            f"&& has(self.speculation.draft.tokenSecretRef))) "
            f"|| !self.podTemplate.engineContainer.env.exists(e, e.name == '{HUB_TOKEN_ENV}')",
            f"`spec.podTemplate.engineContainer.env` must not set {HUB_TOKEN_ENV} when a `tokenSecretRef` is set: the "
            "operator sets it from that Secret; remove the variable",
            lambda s: s.hub_token_secret is None
            or all(v.get("name") != HUB_TOKEN_ENV for v in s.pod_template.engine_container.env),
        ),
        _managed_keys_rule(EngineKind.VLLM),
        _managed_keys_rule(EngineKind.TRTLLM),
    )

    @property
    def hub_token_secret(self) -> str | None:
        """The Secret whose key `token` the engine pods get as HF_TOKEN: the target's, else the draft's (the CRD
        refuses two different ones)."""
        draft = self.speculation.draft
        return self.model.token_secret_ref or (draft.token_secret_ref if draft is not None else None)
