"""An engine pod's `vllm serve` command line, translated to run on this CPU machine with the stand-in models.

    standins = Standins(target=Path(".../standins/target"), draft=Path(".../standins/draft"), max_positions=2048,
                        eagle=Path(".../standins/eagle"), eagle3=Path(".../standins/eagle3"))
    serve = cpu_serve(engine.argv, vllm=env.vllm, port=8000, standins=standins, host="127.80.0.3")
    serve.argv, serve.notes     # what to exec; one line per translation, for the pod's log

Only what cannot exist on a CPU machine is changed, each by one pure function below (listed, with why, in
docs/dev-cluster.md "Real vLLM"): the model names (no hub here: local stand-ins with real weights), the draft's
name inside `--speculative-config` (an EAGLE or EAGLE-3 head's to the stand-in head of its method), revision pins of the models replaced, GPU memory flags (the CPU build sizes
its KV cache from VLLM_CPU_KVCACHE_SPACE), parallel sizes above 1, a context longer than the stand-ins'
positions, and host and port (the pod's IP and containerPort; outside a cluster, vllm_serve's loopback port).
Every other argument — the rest of the `--speculative-config` JSON, `--dtype` (bfloat16 runs here),
`--max-num-seqs`, `--served-model-name`, anything in `engine.extraArgs` — reaches vLLM's own parser as the pod
has it, so vLLM refuses what it would refuse on a GPU.

Exceptions:

    ValueError
     └── NotVllmServe   the command is not `vllm serve MODEL …` (the pod keeps the simulator)
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

Args = tuple[str, ...]

#: vLLM flags that hold GPU memory: a fraction of a GPU, or bytes of one (CacheConfig in vllm/config/cache.py).
GPU_MEMORY_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")
#: Parallel sizes: one process per GPU; the CPU build runs one worker here.
PARALLEL_FLAGS = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp")
#: Pins of a model's Hub repository: meaningless for the local stand-in that replaces the model.
REVISION_FLAGS = ("--revision", "--tokenizer-revision", "--code-revision")
LOOPBACK = "127.0.0.1"


class NotVllmServe(ValueError):
    """A command line that is not `vllm serve MODEL …`."""


@dataclass(frozen=True)
class Standins:
    """The local models every target and every draft name maps to, and how many positions they have
    (standins.MAX_POSITIONS); `eagle` and `eagle3` the stand-in heads the drafts of those methods map to (None:
    their drafts map to `draft`, which vLLM then refuses or runs as it decides)."""

    target: Path
    draft: Path
    max_positions: int
    eagle: Path | None = None
    eagle3: Path | None = None

    def draft_for(self, method: str | None) -> Path:
        """The stand-in a `--speculative-config` draft of `method` maps to."""
        head = {"eagle": self.eagle, "eagle3": self.eagle3}.get(method or "")
        return head or self.draft


@dataclass(frozen=True)
class RealVllm:
    """How the pod runner runs real vLLM: the CPU build's `vllm`, the stand-ins, and each server's KV cache
    (GiB) and OpenMP threads (one each: two cores carry the whole cluster)."""

    vllm: Path
    standins: Standins
    kv_cache_gib: int = 1
    threads: int = 1


@dataclass(frozen=True)
class CpuServe:
    """What to run: the argv (vLLM's executable first) and one line per translation made."""

    argv: Args
    notes: tuple[str, ...]

    @property
    def log_header(self) -> str:
        """The translations, one line each, as a launcher prints them at the top of the server's log."""
        return "".join(f"specdeploy dev-cluster: {note}\n" for note in self.notes)


def is_vllm_serve(argv: Sequence[str]) -> bool:
    """`vllm serve …` (the command the renderer writes), by the executable's base name."""
    return len(argv) >= 2 and posixpath.basename(argv[0]) == "vllm" and argv[1] == "serve"


def flag_value(args: Args, flag: str) -> str | None:
    """The value of `flag` (`--flag V` or `--flag=V`; the last one wins, as argparse does), or None."""
    found = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith(f"{flag}="):
            found = arg.split("=", 1)[1]
    return found


def without_flags(args: Args, flags: Sequence[str]) -> Args:
    """`args` without each of `flags` and its value (both spellings)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not any(arg.startswith(f"{flag}=") for flag in flags):
            kept.append(arg)
    return tuple(kept)


def with_value(args: Args, flag: str, value: str) -> Args:
    """`args` with `flag value` where `flag` first appears (later ones dropped), else at the end."""
    for index, arg in enumerate(args):
        if arg == flag or arg.startswith(f"{flag}="):
            return (*args[:index], flag, value, *without_flags(args[index:], (flag,)))
    return (*args, flag, value)


def replace_model(args: Args, standins: Standins) -> tuple[Args, str]:
    """The positional MODEL (or `--model`) → the stand-in target: no model hub here, and no GPU for a real
    model. Without `--served-model-name`, the pod's model name is added as it, so clients and the metrics'
    `model_name` label see the name the pod would have served."""
    if args and not args[0].startswith("-"):
        model, rest = args[0], args[1:]
    else:
        model = flag_value(args, "--model") or ""
        rest = without_flags(args, ("--model",))
    if not model:
        raise NotVllmServe("`vllm serve` without a model")
    rest = (str(standins.target), *rest)
    if flag_value(rest, "--served-model-name") is None:
        rest = (*rest, "--served-model-name", model)
    return rest, f"model {model} -> stand-in {standins.target}"


def drop_revisions(args: Args) -> tuple[Args, str | None]:
    """Revision pins name commits of the real model's repository; the stand-in has none."""
    kept = without_flags(args, REVISION_FLAGS)
    return kept, (None if kept == args else "revision pins dropped (the stand-ins are local directories)")


def speculative_method(config: dict[str, object]) -> str | None:
    """The method vLLM runs for a `--speculative-config`: its `method`, else what vLLM infers from the draft's
    name (SpeculativeConfig.__post_init__ in vllm/config/speculative.py: "eagle-" in it means eagle, "eagle3"
    eagle3; other names are left to vLLM)."""
    method = config.get("method")
    if isinstance(method, str):
        return method
    name = str(config.get("model", "")).lower()
    return "eagle" if "eagle-" in name else "eagle3" if "eagle3" in name else None


def replace_draft(args: Args, standins: Standins) -> tuple[Args, str | None]:
    """Inside `--speculative-config`: the draft's `model` → the stand-in draft, or for method eagle or eagle3 the
    stand-in head of that method where `standins` has one (its `revision` dropped with it),
    `draft_tensor_parallel_size` above 1 → 1. Every other key stays as the pod wrote it. JSON that does not
    parse is left for vLLM to refuse in its own words."""
    text = flag_value(args, "--speculative-config")
    if text is None:
        return args, None
    try:
        config = json.loads(text)
    except ValueError:
        return args, None
    if not isinstance(config, dict):
        return args, None
    changed = []
    if "model" in config:
        standin = standins.draft_for(speculative_method(config))
        changed.append(f"draft {config['model']} -> stand-in {standin}")
        config["model"] = str(standin)
        if config.pop("revision", None) is not None:
            changed.append("draft revision dropped")
    if _int_above_one(config.get("draft_tensor_parallel_size")):
        changed.append(f"draft_tensor_parallel_size {config['draft_tensor_parallel_size']} -> 1")
        config["draft_tensor_parallel_size"] = 1
    if not changed:
        return args, None
    return with_value(args, "--speculative-config", json.dumps(config, separators=(",", ":"))), "; ".join(changed)


def drop_gpu_memory(args: Args) -> tuple[Args, str | None]:
    """A fraction of a GPU or bytes of one say nothing about this machine's memory: the CPU build sizes its KV
    cache from VLLM_CPU_KVCACHE_SPACE (vllm_env.cpu_environment), which the runner sets."""
    found = [flag for flag in GPU_MEMORY_FLAGS if flag_value(args, flag) is not None]
    if not found:
        return args, None
    return without_flags(args, found), f"{', '.join(found)} dropped (KV cache: VLLM_CPU_KVCACHE_SPACE)"


def single_process(args: Args) -> tuple[Args, str | None]:
    """Tensor and pipeline parallel sizes above 1 need one worker per GPU; here one CPU worker serves the
    stand-in (size 1, vLLM's default, so the flags are dropped)."""
    sizes = {flag: value for flag in PARALLEL_FLAGS if _int_above_one(value := flag_value(args, flag))}
    if not sizes:
        return args, None
    return without_flags(args, tuple(sizes)), ", ".join(f"{flag} {value} -> 1" for flag, value in sizes.items())


def clamp_context(args: Args, standins: Standins) -> tuple[Args, str | None]:
    """A `--max-model-len` above the stand-ins' positions → their maximum (vLLM refuses a longer one:
    `_get_and_verify_max_len` in vllm/config/model.py)."""
    value = flag_value(args, "--max-model-len")
    if value is None or not value.isdigit() or int(value) <= standins.max_positions:
        return args, None
    return (with_value(args, "--max-model-len", str(standins.max_positions)),
            f"--max-model-len {value} -> {standins.max_positions} (the stand-ins' max_position_embeddings)")


def listen_at(args: Args, host: str, port: int) -> tuple[Args, str]:
    """Where to listen: the pod's IP and port in the dev cluster (the rendered `--host 0.0.0.0` would take the port
    on every address of this machine, which all the pods share), or a loopback port outside a cluster."""
    args = with_value(with_value(args, "--host", host), "--port", str(port))
    return args, f"listen on {host}:{port}"


def cpu_serve(argv: Sequence[str], vllm: Path, port: int, standins: Standins, host: str = LOOPBACK) -> CpuServe:
    """The pod's `vllm serve …` with every translation above applied, to run as `vllm` (the CPU build's),
    listening at `host`:`port`."""
    if not is_vllm_serve(argv):
        raise NotVllmServe(f"not a `vllm serve` command line: {list(argv[:3])!r}")
    args, note = replace_model(tuple(argv[2:]), standins)
    notes = [note]
    for translate in (drop_revisions, lambda a: replace_draft(a, standins), drop_gpu_memory, single_process,
                      lambda a: clamp_context(a, standins), lambda a: listen_at(a, host, port)):
        args, made = translate(args)
        if made:
            notes.append(made)
    return CpuServe((str(vllm), "serve", *args), tuple(notes))


def _int_above_one(value: object) -> bool:
    try:
        return int(str(value)) > 1
    except ValueError:
        return False
