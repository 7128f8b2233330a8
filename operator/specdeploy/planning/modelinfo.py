"""What the planner knows about one model: its architecture numbers, what kind of drafter it is, and
where the numbers come from."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from specdeploy.api.spec import Architecture, Method
from specdeploy.planning.checkpoint import CheckpointQuantization


class ModelKind(StrEnum):
    BASE = "base"            # a full language model (a target, or a draft_model draft)
    EAGLE = "eagle"          # an EAGLE-1/2 head: shares the target's embeddings and lm_head
    EAGLE3 = "eagle3"        # an EAGLE-3 head: reads the target's hidden states from several layers
    # Block drafters: decoder layers that read several target layers' hidden states (an `fc` over them) and
    # draft a whole block in one pass; embeddings and lm_head are the target's (vLLM qwen3_dflash.py).
    DFLASH = "dflash"
    DSPARK = "dspark"        # a DFlash backbone plus a low-rank Markov head and a confidence head (qwen3_dspark.py)


_KIND_FOR_METHOD = {
    Method.EAGLE: ModelKind.EAGLE, Method.EAGLE3: ModelKind.EAGLE3,
    Method.DFLASH: ModelKind.DFLASH, Method.DSPARK: ModelKind.DSPARK,
}


def drafter_kind(method: Method | None) -> ModelKind:
    """What a draft named for `method` is taken for when only its `architecture` describes it: a head or block
    drafter of that method, else a full model."""
    return _KIND_FOR_METHOD.get(method, ModelKind.BASE) if method is not None else ModelKind.BASE


@dataclass(frozen=True)
class ModelInfo:
    name: str
    architecture: Architecture
    kind: ModelKind = ModelKind.BASE
    source: str = ""                       # where the numbers come from (config.json URL, paper)
    family: str = ""                       # tokenizer family, e.g. "llama3", "qwen2", "qwen3"
    targets: tuple[str, ...] = field(default=())   # EAGLE heads: the target models they were trained on
    draft_vocab_size: int | None = None    # EAGLE-3 heads with a reduced draft vocabulary (d2t mapping)
    # DFlash / DSpark drafters: the tokens of one block they were trained to draft (DFlash: its config's
    # block_size − 1, the bonus token being the first; DSpark: dspark_block_size, gamma); None when not known.
    trained_block_tokens: int | None = None
    # Bytes per parameter as the checkpoint stores them, where that is not `spec.model.dtype`
    # (gpt-oss ships MXFP4 experts, DeepSeek-V3 FP8): what `quantization: none` loads.
    checkpoint_bytes_per_param: float | None = None
    # The model whose weights this checkpoint holds, quantised or copied (an FP8 or AWQ repository of
    # meta-llama/Llama-3.3-70B-Instruct, a local path with `spec.model.baseModel`): heads pair through it.
    base_model: str = ""
    # What the checkpoint's config.json says it stores; None when no config.json was read (an `architecture`).
    stored_quantization: CheckpointQuantization | None = None
