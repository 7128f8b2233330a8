"""GPU products: memory as the engine sees it, bandwidth and compute for the roofline, node labels.

Memory is what `torch.cuda.mem_get_info` / vLLM report as total (a little under the marketing figure);
bandwidth and dense bf16 FLOP/s are the vendors' datasheet numbers (NVIDIA H100/H200/A100/L40S/L4/B200
datasheets). The node label value is what NVIDIA's GPU feature discovery writes to
`nvidia.com/gpu.product`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProduct:
    name: str
    memory_gib: float
    hbm_bandwidth_gb_s: float
    bf16_tflops: float
    node_label: str


GPU_PRODUCTS: dict[str, GpuProduct] = {
    product.name: product
    for product in (
        # 79.19 GiB is what vLLM reports for an H100 80GB (vLLM memory-profiling logs).
        GpuProduct("H100-80GB", 79.19, 3350.0, 989.0, "NVIDIA-H100-80GB-HBM3"),
        GpuProduct("H200", 139.8, 4800.0, 989.0, "NVIDIA-H200"),
        GpuProduct("A100-80GB", 79.15, 2039.0, 312.0, "NVIDIA-A100-SXM4-80GB"),
        GpuProduct("A100-40GB", 39.39, 1555.0, 312.0, "NVIDIA-A100-SXM4-40GB"),
        GpuProduct("L40S", 44.39, 864.0, 362.0, "NVIDIA-L40S"),
        GpuProduct("L4", 22.03, 300.0, 121.0, "NVIDIA-L4"),
        GpuProduct("B200", 178.36, 8000.0, 2250.0, "NVIDIA-B200"),
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
