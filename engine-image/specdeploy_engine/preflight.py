"""GPU preflight: does the real GPU hold the memory plan, before the engine spends minutes loading weights?

    plan = launch_plan(json.loads(Path("/etc/specdeploy/plan.json").read_text()))
    result = check(plan, read_gpus())          # read_gpus: torch.cuda.mem_get_info, in a child process
    if not result.ok:
        print(result.report(), file=sys.stderr)

`check` is a pure function of the plan and the GPU figures, so tests inject the figures; `read_gpus` is the
only part that touches torch. The rules, per GPU the engine uses:

- every engine: the plan's per-GPU need (weights + overhead + KV cache, `status.memoryPlan.perGpu`) must
  be free now;
- vLLM also asks for total × `--gpu-memory-utilization` at start-up and exits when less than that is free
  (`request_memory` in vllm/v1/worker/utils.py: "Free memory on device … on startup is less than desired
  GPU memory utilization"), so that must be free too.

SGLang and TensorRT-LLM do not refuse in that case; memory held by another process comes out of their
KV cache instead (SGLang: rest = free after weights − total × (1 − mem_fraction_static), in
`profile_max_num_token`, python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py; TensorRT-LLM:
`free_gpu_memory_fraction` of what is free after weights). Lowering `gpuMemoryUtilization` is therefore
offered as a fix for vLLM only.

Standard library only, one file: the launcher runs before anything else in the pod and must not fail on an
import, and with an upstream engine image (which has Python and torch, not this package) the operator mounts
this file from the SD's ConfigMap and an init container runs it on its own:

    python3 /etc/specdeploy/preflight.py --check /etc/specdeploy/plan.json

Exit status 0 (the plan fits, or SPECDEPLOY_PREFLIGHT=warn), 2 (plan.json missing or invalid), 3 (refused: the
report on stderr and in /dev/termination-log, which the kubelet puts in the pod's status).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1024**3
KV_BLOCK_TOKENS = 16               # the plan counts whole 16-token blocks (vLLM's default block size)
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9   # CacheConfig.gpu_memory_utilization default, vllm/config/cache.py
ANOTHER_PROCESS_GIB = 1.0
"""Memory in use above this means another process holds the GPU: the reader's own CUDA context (and the
engine's, which vLLM's start-up check also counts) is a few hundred MiB."""
TOLERANCE_GIB = 0.01               # the plan's GiB figures are rounded to 3 decimals
READ_TIMEOUT_S = 120.0

# Tensor- and pipeline-parallel flags of each engine: GPUs the engine uses = TP × PP.
# vLLM: vllm/engine/arg_utils.py; SGLang: python/sglang/srt/server_args.py; TensorRT-LLM: trtllm-serve's
# click options (tensorrt_llm/commands/serve.py). Same names the renderers in specdeploy.engines write.
_TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp_size", "--tp")
_PP_FLAGS = ("--pipeline-parallel-size", "-pp", "--pp-size", "--pp_size")


class PlanError(ValueError):
    """plan.json is missing, unreadable or not the operator's format; the message says which field."""


class GpuUnavailable(RuntimeError):
    """No GPU figures: torch is missing, sees no GPU, or the reader failed. The message says which."""


@dataclass(frozen=True)
class GpuMemory:
    """One visible GPU as `torch.cuda.mem_get_info(index)` reports it."""

    index: int
    free_bytes: int
    total_bytes: int
    name: str = ""

    @property
    def free_gib(self) -> float:
        return self.free_bytes / GIB

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def in_use_gib(self) -> float:
        return (self.total_bytes - self.free_bytes) / GIB

    def label(self) -> str:
        return f"GPU {self.index} ({self.name})" if self.name else f"GPU {self.index}"


@dataclass(frozen=True)
class PlannedMemory:
    """The per-GPU figures of `status.memoryPlan` the preflight compares with the real GPU (GiB)."""

    target_weights_gib: float
    draft_weights_gib: float
    overhead_gib: float
    kv_cache_gib: float
    budget_gib: float
    kv_bytes_per_token: int | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None

    @property
    def weights_gib(self) -> float:
        return self.target_weights_gib + self.draft_weights_gib

    @property
    def fixed_gib(self) -> float:
        """What the engine holds whatever its budget: weights and overhead."""
        return self.weights_gib + self.overhead_gib

    @property
    def need_gib(self) -> float:
        """What the plan needs free on each GPU: weights + overhead + KV cache."""
        return self.fixed_gib + max(self.kv_cache_gib, 0.0)

    @property
    def min_kv_gib(self) -> float:
        """KV cache for one sequence of maxModelLen: below it vLLM refuses to start (0 when unknown)."""
        if not self.kv_bytes_per_token or not self.max_model_len:
            return 0.0
        return self.kv_bytes_per_token * self.max_model_len / GIB

    def kv_tokens(self, kv_gib: float) -> int | None:
        """Tokens a KV cache of `kv_gib` holds, in whole blocks; None without kvBytesPerToken."""
        if not self.kv_bytes_per_token:
            return None
        tokens = int(max(kv_gib, 0.0) * GIB // self.kv_bytes_per_token)
        return tokens // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS


@dataclass(frozen=True)
class EngineArgs:
    """What the preflight reads from the engine's command line."""

    engine: str                               # vllm | sglang | trtllm
    gpus: int                                 # tensor parallel × pipeline parallel
    gpu_memory_utilization: float | None      # vLLM's share of the whole GPU; None for other engines
    port: int | None


@dataclass(frozen=True)
class LaunchPlan:
    """plan.json: the memory plan of this variant's pods, the engine's command line, and over how many pods (one
    per node) the engine's GPUs are spread: a layout across nodes puts TP × PP ÷ nodes GPUs in each pod."""

    memory: PlannedMemory
    argv: tuple[str, ...]
    nodes: int = 1

    @property
    def gpus_per_pod(self) -> int:
        return math.ceil(self.engine_args.gpus / self.nodes)

    @property
    def engine_args(self) -> EngineArgs:
        return engine_args(self.argv)


@dataclass(frozen=True)
class GpuCheck:
    """The verdict for one GPU: the problems that stop the engine, what fixes them, and notes."""

    gpu: GpuMemory
    need_gib: float
    requested_gib: float | None               # vLLM: total × gpuMemoryUtilization
    problems: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class PreflightResult:
    """All GPUs' verdicts; `report()` is what the launcher prints (and writes to the termination log)."""

    engine: str
    plan: PlannedMemory
    checks: tuple[GpuCheck, ...]
    problems: tuple[str, ...] = field(default=())   # not tied to one GPU (too few GPUs)

    @property
    def ok(self) -> bool:
        return not self.problems and all(c.ok for c in self.checks)

    def report(self) -> str:
        """One paragraph per GPU: the plan's need, the real free/total memory and, on refusal, the fix."""
        failing = [c for c in self.checks if not c.ok]
        if self.ok:
            head = f"specdeploy preflight: the GPU memory holds the plan; starting {self.engine}."
        else:
            which = ", ".join(f"GPU {c.gpu.index}" for c in failing) or "the GPUs"
            head = f"specdeploy preflight refused to start {self.engine}: {which} cannot hold the memory plan."
        lines = [head, *self.problems]
        for gpu_check in sorted(self.checks, key=lambda c: c.ok):   # failing GPUs first: the log may be cut
            lines.append(_gpu_line(gpu_check, self.plan))
            lines += [f"  {problem}" for problem in gpu_check.problems]
            if gpu_check.fixes:
                lines.append("  Fix: " + "; or ".join(gpu_check.fixes) + ".")
            lines += [f"  Note: {note}" for note in gpu_check.notes]
        if not self.ok:
            lines.append("SPECDEPLOY_PREFLIGHT=warn starts the engine anyway; =off skips this check.")
        return "\n".join(lines)


def _gpu_line(gpu_check: GpuCheck, plan: PlannedMemory) -> str:
    gpu = gpu_check.gpu
    verdict = "fits" if gpu_check.ok else "does not fit"
    return (f"{gpu.label()}: the plan needs {plan.need_gib:.2f} GiB (weights {plan.weights_gib:.2f} + overhead "
            f"{plan.overhead_gib:.2f} + KV cache {max(plan.kv_cache_gib, 0.0):.2f}); {gpu.free_gib:.2f} GiB of "
            f"{gpu.total_gib:.2f} GiB is free ({gpu.in_use_gib:.2f} GiB in use): {verdict}.")


# ---------------------------------------------------------------------------------------------- plan.json


def _number(mapping: Mapping[str, Any], key: str, where: str) -> float:
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"plan.json: `{where}{key}` must be a number, got {value!r}")
    return float(value)


def _optional_int(mapping: Mapping[str, Any], key: str) -> int | None:
    value = mapping.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def planned_memory(memory_plan: Any) -> PlannedMemory:
    """The preflight's figures from `status.memoryPlan` (camelCase wire JSON)."""
    if not isinstance(memory_plan, Mapping):
        raise PlanError(f"plan.json: `memoryPlan` must be an object, got {type(memory_plan).__name__}")
    per_gpu = memory_plan.get("perGpu")
    if not isinstance(per_gpu, Mapping):
        raise PlanError("plan.json: `memoryPlan.perGpu` must be an object with budgetGiB, targetWeightsGiB, "
                        "draftWeightsGiB, overheadGiB and kvCacheGiB")
    where = "memoryPlan.perGpu."
    return PlannedMemory(
        target_weights_gib=_number(per_gpu, "targetWeightsGiB", where),
        draft_weights_gib=_number(per_gpu, "draftWeightsGiB", where),
        overhead_gib=_number(per_gpu, "overheadGiB", where),
        kv_cache_gib=_number(per_gpu, "kvCacheGiB", where),
        budget_gib=_number(per_gpu, "budgetGiB", where),
        kv_bytes_per_token=_optional_int(memory_plan, "kvBytesPerToken"),
        kv_cache_tokens=_optional_int(memory_plan, "kvCacheTokens"),
        max_model_len=_optional_int(memory_plan, "maxModelLen"),
    )


def launch_plan(data: Any) -> LaunchPlan:
    """plan.json as the operator writes it: `{"memoryPlan": {…}, "argv": ["vllm", "serve", …]}`."""
    if not isinstance(data, Mapping):
        raise PlanError(f"plan.json must hold a JSON object with memoryPlan and argv, got {type(data).__name__}")
    if "memoryPlan" not in data:
        raise PlanError("plan.json has no `memoryPlan`: expected {\"memoryPlan\": {…}, \"argv\": […]}")
    argv = data.get("argv", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise PlanError(f"plan.json: `argv` must be a list of strings, got {argv!r}")
    nodes = data.get("nodes", 1)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise PlanError(f"plan.json: `nodes` must be a whole number of at least 1, got {nodes!r}")
    return LaunchPlan(memory=planned_memory(data["memoryPlan"]), argv=tuple(argv), nodes=nodes)


# ----------------------------------------------------------------------------------------- command line


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The last value given to any of `names` (`--flag value` or `--flag=value`), as argparse keeps the last."""
    value: str | None = None
    for position, word in enumerate(argv):
        for name in names:
            if word == name and position + 1 < len(argv):
                value = argv[position + 1]
            elif word.startswith(name + "="):
                value = word[len(name) + 1:]
    return value


def engine_of(argv: Sequence[str]) -> str:
    """vllm, sglang or trtllm, told by the command: `trtllm-serve …`, `python3 -m sglang.launch_server …`.

    The engine profiles' recognisers (`specdeploy.engines.engine_of`) read a command line the same way; this file
    imports nothing of specdeploy (see the module docstring), so it keeps its own copy and
    tests/unit/test_engine_profiles.py holds the two equal."""
    head = [word.rsplit("/", 1)[-1] for word in argv[:4]]
    if any(word.startswith("trtllm-serve") for word in head):
        return "trtllm"
    if any(word.startswith("sglang") for word in head):
        return "sglang"
    return "vllm"


def _positive_int(text: str | None) -> int:
    try:
        return max(1, int(text)) if text is not None else 1
    except ValueError:
        return 1


def engine_args(argv: Sequence[str]) -> EngineArgs:
    """The engine, its GPU count, vLLM's memory share and the port, read from its command line."""
    engine = engine_of(argv)
    gpus = _positive_int(flag_value(argv, *_TP_FLAGS)) * _positive_int(flag_value(argv, *_PP_FLAGS))
    utilization: float | None = None
    if engine == "vllm":
        text = flag_value(argv, "--gpu-memory-utilization")
        try:
            utilization = float(text) if text is not None else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        except ValueError:
            utilization = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    port_text = flag_value(argv, "--port")
    port = int(port_text) if port_text is not None and port_text.isdigit() else None
    return EngineArgs(engine=engine, gpus=gpus, gpu_memory_utilization=utilization, port=port)


# ---------------------------------------------------------------------------------------------- decision


def _fits_utilization(plan: PlannedMemory, gpu: GpuMemory, current: float) -> float | None:
    """The highest gpuMemoryUtilization (2 decimals) whose request is free now and still holds one sequence."""
    utilization = math.floor(gpu.free_bytes / gpu.total_bytes * 100) / 100
    if utilization >= current or utilization <= 0:
        return None
    if utilization * gpu.total_gib - plan.fixed_gib < max(plan.min_kv_gib, TOLERANCE_GIB):
        return None
    return utilization


def _lower_utilization_fix(plan: PlannedMemory, gpu: GpuMemory, utilization: float) -> str:
    kv_gib = utilization * gpu.total_gib - plan.fixed_gib
    text = f"lower `spec.resources.gpuMemoryUtilization` to {utilization:.2f} (the KV cache shrinks to {kv_gib:.2f} GiB"
    tokens = plan.kv_tokens(kv_gib)
    if tokens is not None:
        text += f": {tokens:,} tokens"
        if plan.max_model_len:
            text += f", {tokens / plan.max_model_len:.2f} sequences of {plan.max_model_len:,}"
    return text + ")"


def _check_gpu(plan: PlannedMemory, gpu: GpuMemory, args: EngineArgs) -> GpuCheck:
    need = plan.need_gib
    problems: list[str] = []
    notes: list[str] = []
    requested: float | None = None
    if gpu.total_bytes <= 0:
        return GpuCheck(gpu, need, None, problems=("torch reports no memory on this GPU",))
    if need > gpu.free_gib + TOLERANCE_GIB:
        problems.append(f"The plan needs {need - gpu.free_gib:.2f} GiB more than is free.")
    if args.gpu_memory_utilization is not None:
        requested = gpu.total_gib * args.gpu_memory_utilization
        if requested > gpu.free_gib + TOLERANCE_GIB:
            problems.append(
                f"vLLM asks for total × gpuMemoryUtilization = {gpu.total_gib:.2f} × {args.gpu_memory_utilization:g} = "
                f"{requested:.2f} GiB at start-up and exits when less is free.")
        elif plan.budget_gib > 0 and abs(requested - plan.budget_gib) > 0.02 * plan.budget_gib:
            kv_gib = requested - plan.fixed_gib
            notes.append(
                f"the plan was made for a budget of {plan.budget_gib:.2f} GiB per GPU but on this GPU vLLM takes "
                f"{requested:.2f} GiB, so its KV cache will be about {kv_gib:.2f} GiB, not "
                f"{plan.kv_cache_gib:.2f}: check that `spec.resources.gpu` names this GPU.")
    if not problems:
        return GpuCheck(gpu, need, requested, notes=tuple(notes))
    return GpuCheck(gpu, need, requested, problems=tuple(problems), fixes=_fixes(plan, gpu, args, need, requested),
                    notes=tuple(notes))


def _fixes(plan: PlannedMemory, gpu: GpuMemory, args: EngineArgs, need: float,
           requested: float | None) -> tuple[str, ...]:
    fixes: list[str] = []
    if gpu.in_use_gib >= ANOTHER_PROCESS_GIB:
        fixes.append(f"free the GPU: {gpu.in_use_gib:.2f} GiB of it is held by another process (`nvidia-smi` on "
                     "the node names it: a pod sharing the GPU, or an engine that did not exit)")
    if args.gpu_memory_utilization is not None and requested is not None:
        utilization = _fits_utilization(plan, gpu, args.gpu_memory_utilization)
        if utilization is not None:
            fixes.append(_lower_utilization_fix(plan, gpu, utilization))
    if not fixes or need > gpu.total_gib:
        fixes.append(f"use a GPU with more memory (this one has {gpu.total_gib:.2f} GiB; check that "
                     "`spec.resources.gpu` names it), quantise the target (`spec.model.quantization: fp8`) or "
                     "shard it over more GPUs (`spec.resources.tensorParallelSize`)")
    return tuple(fixes)


def check(plan: LaunchPlan, gpus: Sequence[GpuMemory]) -> PreflightResult:
    """Whether the GPUs the engine will use hold `plan`; pure, so tests pass GPU figures in."""
    args = plan.engine_args
    problems: list[str] = []
    if not gpus:
        problems.append("No GPU is visible to this container: check the pod's `nvidia.com/gpu` limit and the "
                        "node's NVIDIA device plugin.")
    elif len(gpus) < plan.gpus_per_pod:
        spread = f", {plan.gpus_per_pod} in each of its {plan.nodes} pods," if plan.nodes > 1 else ""
        problems.append(f"The engine needs {args.gpus} GPUs (tensor parallel × pipeline parallel){spread} but "
                        f"{len(gpus)} are visible: check the pod's `nvidia.com/gpu` limit.")
    used = sorted(gpus, key=lambda g: g.index)[: max(plan.gpus_per_pod, 1)]
    checks = tuple(_check_gpu(plan.memory, gpu, args) for gpu in used)
    return PreflightResult(engine=args.engine, plan=plan.memory, checks=checks, problems=tuple(problems))


# ---------------------------------------------------------------------------------------------- reading


def read_gpus_with_torch() -> list[GpuMemory]:
    """`torch.cuda.mem_get_info` on every visible GPU, in this process (it creates a CUDA context on each).

    Raises GpuUnavailable when torch is not installed or sees no GPU.
    """
    try:
        import torch
    except ImportError as error:
        raise GpuUnavailable(f"torch is not installed in this image ({error}), so GPU memory cannot be read") from error
    if not torch.cuda.is_available():
        raise GpuUnavailable("torch sees no CUDA GPU (torch.cuda.is_available() is False): the container has no GPU "
                             "device, or its driver does not match the image's CUDA")
    gpus = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        gpus.append(GpuMemory(index, int(free), int(total), str(torch.cuda.get_device_name(index))))
    if not gpus:
        raise GpuUnavailable("torch sees no CUDA GPU (torch.cuda.device_count() is 0)")
    return gpus


def read_gpus(python: str | None = None, timeout_s: float = READ_TIMEOUT_S) -> list[GpuMemory]:
    """The visible GPUs' figures, read by a child Python that exits before the engine starts.

    A child, because the CUDA context `mem_get_info` creates holds GPU memory for as long as its process
    lives; the launcher then execs the engine and must hold none. The engine creates its own context before
    its check, so what the child sees free is what the engine will see.
    """
    # This file by its path: it runs the same as a module of the package or on its own from the ConfigMap.
    command = [python or sys.executable, os.path.abspath(__file__), "--read-gpus"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as error:
        raise GpuUnavailable(f"reading GPU memory took longer than {timeout_s:g} s (a hung GPU or driver?)") from error
    except OSError as error:
        raise GpuUnavailable(f"cannot run {command[0]} to read GPU memory: {error}") from error
    return gpus_from_json(done.stdout, done.stderr, done.returncode)


def gpus_from_json(stdout: str, stderr: str = "", returncode: int = 0) -> list[GpuMemory]:
    """The reader child's answer: `{"gpus": [...]}` or `{"error": "..."}` on its last output line."""
    lines = stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise GpuUnavailable(f"the GPU memory reader failed (exit {returncode}): {tail}")
    if "error" in answer:
        raise GpuUnavailable(str(answer["error"]))
    return [GpuMemory(int(g["index"]), int(g["free_bytes"]), int(g["total_bytes"]), str(g.get("name", "")))
            for g in answer.get("gpus", [])]


TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_BYTES = 4096   # what Kubernetes keeps of a termination message
EXIT_PLAN = 2
EXIT_REFUSED = 3


def check_plan_file(path: str, warn: bool, read: Callable[[], list[GpuMemory]] = read_gpus) -> tuple[int, str]:
    """The init container's check of plan.json at `path`: its exit status and its report. A refusal (also a GPU
    that cannot be read) is exit 3 unless `warn`, which reports and lets the engine start."""
    try:
        with open(path, encoding="utf-8") as handle:
            plan = launch_plan(json.load(handle))
    except (OSError, ValueError) as error:
        return EXIT_PLAN, f"specdeploy preflight cannot read the plan {path}: {error}"
    try:
        result = check(plan, read())
    except GpuUnavailable as error:
        engine = plan.engine_args
        report = (f"specdeploy preflight refused to start {engine.engine}: it cannot read GPU memory: {error}. "
                  f"{engine.engine} needs {engine.gpus} GPU(s).\nSPECDEPLOY_PREFLIGHT=warn in "
                  "`spec.engine.env` starts the engine anyway; =off skips this check.")
        return (0 if warn else EXIT_REFUSED), report
    if result.ok or warn:
        return 0, result.report()
    return EXIT_REFUSED, result.report()


def _write_termination_log(message: str) -> None:
    """The refusal where the kubelet reads a container's termination message (only inside a container)."""
    if os.path.exists(TERMINATION_LOG):
        with open(TERMINATION_LOG, "wb") as handle:
            handle.write(message.encode("utf-8")[:TERMINATION_MESSAGE_BYTES])


def main(argv: Sequence[str] | None = None) -> int:
    """`--read-gpus`: print the visible GPUs' memory as one JSON line. `--check PLAN`: the init container's
    preflight (SPECDEPLOY_PREFLIGHT=warn reports without refusing)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--check":
        status, report = check_plan_file(args[1], warn=os.environ.get("SPECDEPLOY_PREFLIGHT", "").lower() == "warn")
        print(report, file=sys.stderr)
        if status:
            _write_termination_log(report)
        return status
    if args != ["--read-gpus"]:
        print("usage: preflight.py --read-gpus | --check PLAN_JSON", file=sys.stderr)
        return 2
    try:
        gpus = read_gpus_with_torch()
    except GpuUnavailable as error:
        print(json.dumps({"error": str(error)}))
        return 0
    print(json.dumps({"gpus": [asdict(g) for g in gpus]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
