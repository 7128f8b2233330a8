"""What the engine prints: its start-up lines, and the CUDA out-of-memory crash.

The crash text matters downstream: a pod with `terminationMessagePolicy: FallbackToLogsOnError` carries
the last log lines in lastState.terminated.message, and the operator rolls speculation back when a
speculative pod died of `torch.OutOfMemoryError: CUDA out of memory`. The wording is PyTorch's
(c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x).
"""

from __future__ import annotations

import time

from specdeploy_engine.sim.engines import SIMULATED_ENGINES
from specdeploy_engine.sim.model import ServedModel

GIB = 1024**3


def _stamp() -> str:
    return time.strftime("%m-%d %H:%M:%S")


def oom_message(served: ServedModel, *, tried_gib: float = 1.96) -> str:
    """A traceback ending in PyTorch's CUDA OOM error, sized to the GPU the engine runs on."""
    total = served.gpu.memory_gib
    free_mib = 27.06
    in_use = total - free_mib / 1024
    allocated = in_use * 0.94
    reserved = in_use - allocated - 0.31
    path, function, headline = SIMULATED_ENGINES[served.config.kind].crash_site
    return (
        f"ERROR {_stamp()} [{path.rsplit('/', 1)[-1]}] {headline}\n"
        "Traceback (most recent call last):\n"
        f'  File "/usr/local/lib/python3.12/dist-packages/{path}", line 712, in {function}\n'
        "    engine_core.run_busy_loop()\n"
        '  File "/usr/local/lib/python3.12/dist-packages/torch/utils/_contextlib.py", line 116, in decorate_context\n'
        "    return func(*args, **kwargs)\n"
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. GPU 0 has a total "
        f"capacity of {total:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, this "
        f"process has {in_use:.2f} GiB memory in use. Of the allocated memory {allocated:.2f} GiB is allocated by "
        f"PyTorch, and {reserved:.2f} GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
    )


def startup_lines(served: ServedModel, host: str, port: int) -> list[str]:
    """Log lines the engine prints while starting (vLLM's wording for the KV cache lines)."""
    config = served.config
    lines = [f"INFO {_stamp()} [specdeploy-sim] simulating {config.kind.value} for {config.model} on "
             f"{config.tensor_parallel_size}x {served.gpu.name} (no GPU is used)"]
    if config.speculation is not None:
        speculation = config.speculation
        lines.append(f"INFO {_stamp()} [specdeploy-sim] speculative decoding: {speculation.engine_method}, "
                     f"k={speculation.num_speculative_tokens}, draft={speculation.draft_model or '-'}, "
                     f"default acceptance rate {served.default_acceptance_rate:.3f}")
    lines += [f"WARNING {_stamp()} [specdeploy-sim] {note}" for note in served.notes]
    if served.kv_cache_tokens:
        lines.append(f"INFO {_stamp()} [kv_cache_utils.py] GPU KV cache size: {served.kv_cache_tokens:,} tokens")
        lines.append(f"INFO {_stamp()} [kv_cache_utils.py] Maximum concurrency for {served.max_model_len:,} tokens "
                     f"per request: {served.kv_cache_tokens / served.max_model_len:.2f}x")
    lines.append(f"INFO {_stamp()} [api_server.py] Starting the API server on http://{host}:{port}")
    return lines
