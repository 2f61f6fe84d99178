"""GPUs the book's scripts know: dense bf16 peak and memory, and the lookup from a CUDA device name.

budget.py plans a run with these figures; train_gpu.py reads the peak of the GPU it runs on to
report MFU. A GPU missing here gets no MFU rather than another GPU's peak.
"""
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense bf16 tensor-core FLOP/s from the datasheet (no sparsity)
    memory_gb: float
    patterns: tuple  # lower-case substrings that all occur in torch.cuda.get_device_name()


# NVIDIA datasheets, dense bf16 (the sparse "2×" figures halved); the same figures nanochat uses.
# Order matters for name lookup: the more specific name (PCIe, NVL) comes before the plain one.
CATALOG = (
    GPU("B200", 2.25e15, 180, ("b200",)),
    GPU("H200-NVL", 836e12, 141, ("h200", "nvl")),
    GPU("H200", 989e12, 141, ("h200",)),
    GPU("H100-NVL", 835e12, 94, ("h100", "nvl")),
    GPU("H100-PCIe", 756e12, 80, ("h100", "pcie")),
    GPU("H100", 989e12, 80, ("h100",)),  # SXM
    GPU("A100-40GB", 312e12, 40, ("a100", "40gb")),
    GPU("A100", 312e12, 80, ("a100",)),
    GPU("L40S", 362e12, 48, ("l40s",)),
    GPU("A10", 125e12, 24, ("a10",)),  # matched as a whole word below: not A100, not A10G
    GPU("L4", 121e12, 24, ("l4",)),  # whole word: not L40S
    GPU("RTX4090", 165.2e12, 24, ("4090",)),
    GPU("RTX3090", 71e12, 24, ("3090",)),
)
GPUS = {g.name.lower(): g for g in CATALOG}


def gpu_for_device(device_name: str):
    """The catalog entry for a CUDA device name (e.g. 'NVIDIA H100 80GB HBM3'), or None if unknown."""
    words = set(re.findall(r"[a-z0-9]+", device_name.lower()))
    if words & {"laptop", "mobile"}:  # same chip name, far lower clocks and power
        return None
    for g in CATALOG:
        if all(p in words for p in g.patterns):  # whole words: "a100" must not match "A1000"
            return g
    return None
