"""GPU products: memory as the engine sees it, bandwidth and compute for the roofline, node labels.

Memory is what `torch.cuda.mem_get_info` / vLLM report as total (a little under the marketing figure);
bandwidth and dense (not 2:4-sparse) bf16 and FP8 FLOP/s are the vendors' datasheet numbers (NVIDIA
H100/H200/A100/L40S/L4/B200 datasheets; each datasheet prints the sparse figure, twice the dense one).
The compute capability is NVIDIA's (developer.nvidia.com/cuda-gpus): FP8 tensor cores from 8.9 (Ada,
Hopper, Blackwell), where vLLM runs `--quantization fp8` as FP8 × FP8 GEMMs; an A100 (8.0) has none
and runs FP8 weight-only with bf16 compute. The node label value is what NVIDIA's GPU feature
discovery writes to `nvidia.com/gpu.product`. GPUs per node is the usual server of the product, each with its
source beside it; a cluster of other servers sets `spec.resources.gpu.perNode`. The roofline's efficiencies (planning/roofline.py) were fitted on
one measured H100 and are applied to every product's datasheet numbers (docs/speedup-model.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProduct:
    name: str
    memory_gib: float
    hbm_bandwidth_gb_s: float
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores
    compute_capability: tuple[int, int]
    node_label: str
    gpus_per_node: int = 8


GPU_PRODUCTS: dict[str, GpuProduct] = {
    product.name: product
    for product in (
        # 79.19 GiB is what vLLM reports for an H100 80GB (vLLM memory-profiling logs).
        # H100 SXM datasheet: bf16 1,979 and FP8 3,958 TFLOPS with sparsity. 8 per node: HGX/DGX H100 datasheets.
        GpuProduct("H100-80GB", 79.19, 3350.0, 989.0, 1979.0, (9, 0), "NVIDIA-H100-80GB-HBM3"),
        # H200 datasheet: the same tensor cores as the H100 SXM (FP8 3,958 TFLOPS with sparsity). 8 per node: HGX
        # H200 and DGX H200 datasheets.
        GpuProduct("H200", 139.8, 4800.0, 989.0, 1979.0, (9, 0), "NVIDIA-H200"),
        # A100 datasheet: bf16 312 TFLOPS dense; no FP8 tensor cores. 8 per node: HGX A100 8-GPU and DGX A100.
        GpuProduct("A100-80GB", 79.15, 2039.0, 312.0, None, (8, 0), "NVIDIA-A100-SXM4-80GB"),
        GpuProduct("A100-40GB", 39.39, 1555.0, 312.0, None, (8, 0), "NVIDIA-A100-SXM4-40GB"),
        # L40S datasheet: bf16 733 and FP8 1,466 TFLOPS with sparsity. 8 per node: NVIDIA OVX L40S servers.
        GpuProduct("L40S", 44.39, 864.0, 362.0, 733.0, (8, 9), "NVIDIA-L40S"),
        # L4 datasheet: bf16 242 and FP8 485 TFLOPS with sparsity. 8 per node: the largest L4 machine of the
        # clouds (Google Cloud g2-standard-96).
        GpuProduct("L4", 22.03, 300.0, 121.0, 242.5, (8, 9), "NVIDIA-L4"),
        # HGX B200 datasheet, per GPU: bf16 4.5 and FP8 9 PFLOPS with sparsity. 8 per node: HGX/DGX B200.
        GpuProduct("B200", 178.36, 8000.0, 2250.0, 4500.0, (10, 0), "NVIDIA-B200"),
    )
}

_ALIASES = {
    "H100": "H100-80GB", "H100-SXM": "H100-80GB", "NVIDIA-H100-80GB-HBM3": "H100-80GB",
    "H200-141GB": "H200", "NVIDIA-H200": "H200",
    "A100": "A100-80GB", "NVIDIA-A100-SXM4-80GB": "A100-80GB", "NVIDIA-A100-SXM4-40GB": "A100-40GB",
    "NVIDIA-L40S": "L40S", "NVIDIA-L4": "L4", "NVIDIA-B200": "B200",
}


def find_gpu(product: str) -> GpuProduct | None:
    """The product named `product` (case-insensitive, common aliases accepted), or None."""
    wanted = product.strip().upper()
    for name, gpu in GPU_PRODUCTS.items():
        if name.upper() == wanted:
            return gpu
    for alias, name in _ALIASES.items():
        if alias.upper() == wanted:
            return GPU_PRODUCTS[name]
    return None
