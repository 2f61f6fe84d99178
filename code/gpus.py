"""GPUs the book's scripts know: dense tensor-core peak, memory, and the lookup from a CUDA device.

budget.py plans a run with these figures; train_gpu.py reads the peak of the GPU it runs on to
report MFU, and its --preflight compares the box with them. Below the catalog: what a ring of GPUs sends
per second once it spans machines (link_bytes_per_s), and the torchrun flags launch/ starts a run with,
which budget.py prints in its command. A GPU missing here, or one whose SM count does not match its name (a MIG slice, a
cut-down variant), gets no MFU rather than another GPU's peak.

The lookup uses the device name *and* its SM count (torch.cuda.get_device_properties(i)
.multi_processor_count): an H100 SXM has 132 SMs and an H100 PCIe 114, whatever the name says.
"""
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense tensor-core FLOP/s from the datasheet (no sparsity), in `precision`
    memory_gb: float
    patterns: tuple  # lower-case words that must all occur in torch.cuda.get_device_name()
    sms: tuple | None = None  # SM counts this entry has; None: not checked
    variant: tuple = ()  # words that name this variant; not needed when the SM count identifies it
    exclude: tuple = ()  # words that mean another GPU (3060 Ti is not a 3060)
    precision: str = "bf16"  # what peak_flops counts; "fp16" for GPUs without bf16 tensor cores
    link_gb_s: float | None = None  # GPU-to-GPU bandwidth inside one machine, GB/s per GPU per direction
    link: str = ""  # what carries it


    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"


# Dense figures: NVIDIA datasheets print the 2:4-sparsity figure with an asterisk; these are half of it.
# Order matters: a more specific entry (NVL, PCIe, 40GB) comes before the plain one.
#
# link_gb_s: what one GPU can send to the others in the same machine, per direction: half the
# "both directions" figure the datasheets print. NVLink figures from the same datasheets (B200 1.8 TB/s;
# H100/H200 SXM and H20 900 GB/s; H800 400; A100 600; A800 400; V100 SXM2 300). PCIe cards: the PCIe
# figure of their datasheet (5.0 x16: 128 GB/s; 4.0 x16: 64; 3.0 x16: 32), also for the NVL cards,
# whose NVLink bridges join only pairs or fours; GeForce cards have no peer-to-peer NVLink at all.
# These are the links' peaks; NCCL's measured all-reduce bus bandwidth is typically 70-90 % of them
# (an expectation, not measured here; chapter 7 measures this machine's own).
# GeForce cards: the PCIe figure is a best case, labelled an expectation. GeForce RTX 40 cards have
# peer-to-peer disabled (NVIDIA/nccl#1127; tinygrad/open-gpu-kernel-modules patches the driver to get
# it), so NCCL copies through host memory; on RTX 30 cards it depends on the driver.
GEFORCE_40_LINK = ("PCIe 4.0 x16, 64 GB/s both directions; an expected upper bound: no peer-to-peer on "
                   "GeForce RTX 40, NCCL copies through host memory")
GEFORCE_30_LINK = ("PCIe 4.0 x16, 64 GB/s both directions; an expected upper bound: GeForce peer-to-peer "
                   "depends on the driver")
CATALOG = (
    GPU("B200", 2.25e15, 180, ("b200",),  # HGX B200 spec: bf16 4.5 PFLOPS per GPU with sparsity
        link_gb_s=900, link="NVLink 5, 1800 GB/s both directions"),
    # H200 datasheet (nvidia.com/en-us/data-center/h200): bf16 1,979 TFLOPS (SXM), 1,671 (NVL), sparse
    GPU("H200-NVL", 836e12, 141, ("h200", "nvl"), sms=(132,),
        link_gb_s=64, link="PCIe 5.0 x16, 128 GB/s both directions"),
    GPU("H200", 989e12, 141, ("h200",), sms=(132,),
        link_gb_s=450, link="NVLink 4, 900 GB/s both directions"),
    # H100 datasheet (nvidia.com/en-us/data-center/h100): bf16 1,979 (SXM), 1,513 (PCIe), 1,671 (NVL) sparse
    GPU("H100-NVL", 835e12, 94, ("h100", "nvl"), sms=(132,),
        link_gb_s=64, link="PCIe 5.0 x16, 128 GB/s both directions"),
    GPU("H100-PCIe", 756e12, 80, ("h100",), sms=(114,), variant=("pcie",),
        link_gb_s=64, link="PCIe 5.0 x16, 128 GB/s both directions"),
    GPU("H100", 989e12, 80, ("h100",), sms=(132,),  # SXM
        link_gb_s=450, link="NVLink 4, 900 GB/s both directions"),
    # H800 datasheet (the H100 chip with reduced NVLink for China): bf16 1,979 (SXM), 1,513 (PCIe) sparse
    GPU("H800-PCIe", 756e12, 80, ("h800",), sms=(114,), variant=("pcie",),
        link_gb_s=64, link="PCIe 5.0 x16, 128 GB/s both directions"),
    GPU("H800", 989e12, 80, ("h800",), sms=(132,),
        link_gb_s=200, link="NVLink 4, 400 GB/s both directions"),
    # H20 (export variant, no public NVIDIA datasheet): 148 TFLOPS bf16 dense as published by NVIDIA's partners
    GPU("H20", 148e12, 96, ("h20",),
        link_gb_s=450, link="NVLink 4, 900 GB/s both directions"),
    # A100 datasheet: bf16 312 TFLOPS dense (624 sparse) for 40/80 GB, SXM and PCIe alike; 108 SMs
    GPU("A100-40GB", 312e12, 40, ("a100", "40gb"), sms=(108,),
        link_gb_s=300, link="NVLink 3, 600 GB/s both directions"),
    GPU("A100", 312e12, 80, ("a100",), sms=(108,),
        link_gb_s=300, link="NVLink 3, 600 GB/s both directions"),
    # A800 datasheet (A100 with reduced NVLink): bf16 312 TFLOPS dense
    GPU("A800-40GB", 312e12, 40, ("a800", "40gb"), sms=(108,),
        link_gb_s=200, link="NVLink 3, 400 GB/s both directions"),
    GPU("A800", 312e12, 80, ("a800",), sms=(108,),
        link_gb_s=200, link="NVLink 3, 400 GB/s both directions"),
    GPU("L40S", 362e12, 48, ("l40s",), sms=(142,),  # L40S datasheet: bf16 362.05 dense (733 sparse)
        link_gb_s=32, link="PCIe 4.0 x16, 64 GB/s both directions"),
    GPU("A10", 125e12, 24, ("a10",), sms=(72,),  # A10 datasheet: bf16 125 dense (250 sparse); not A10G
        link_gb_s=32, link="PCIe 4.0 x16, 64 GB/s both directions"),
    GPU("L4", 121e12, 24, ("l4",), sms=(58,),  # L4 datasheet: bf16 242 sparse → 121 dense; not L40S
        link_gb_s=32, link="PCIe 4.0 x16, 64 GB/s both directions"),
    # T4 datasheet: "mixed precision (FP16/FP32) 65 TFLOPS"; Turing has no bf16 tensor cores
    GPU("T4", 65e12, 16, ("t4",), sms=(40,), precision="fp16",
        link_gb_s=16, link="PCIe 3.0 x16, 32 GB/s both directions"),
    # V100 datasheet: "deep learning 125 TFLOPS" (SXM2), 112 (PCIe), fp16 tensor; Volta has no bf16.
    # Both have 80 SMs, so the name tells them apart.
    GPU("V100-PCIe", 112e12, 16, ("v100", "pcie"), sms=(80,), precision="fp16",
        link_gb_s=16, link="PCIe 3.0 x16, 32 GB/s both directions"),
    GPU("V100", 125e12, 16, ("v100",), sms=(80,), precision="fp16",
        link_gb_s=150, link="NVLink 2, 300 GB/s both directions"),
    # GeForce: "peak FP16 tensor TFLOPS with FP32 accumulate" (what bf16/fp16 autocast uses):
    # Ada whitepaper (RTX 4090): 165.2 dense = 128 SMs × 2.52 GHz × 512 FLOP/clock/SM
    GPU("RTX4090", 165.2e12, 24, ("4090",), sms=(128,),
        link_gb_s=32, link=GEFORCE_40_LINK),
    # RTX 4070: not in the whitepaper; 46 SMs × 2.475 GHz boost (NVIDIA spec page) × 512, the Ada rate above
    GPU("RTX4070", 58.3e12, 12, ("4070",), sms=(46,), exclude=("ti", "super"),
        link_gb_s=32, link=GEFORCE_40_LINK),
    # Ampere GA102 whitepaper (RTX 3090): 71 dense = 82 SMs × 1.695 GHz × 512
    GPU("RTX3090", 71e12, 24, ("3090",), sms=(82,), exclude=("ti",),
        link_gb_s=32, link=GEFORCE_30_LINK),
    # RTX 3060 12 GB: not in the whitepaper; 28 SMs × 1.777 GHz boost (NVIDIA spec page) × 512, the GA102 rate
    GPU("RTX3060", 25.5e12, 12, ("3060",), sms=(28,), exclude=("ti",),
        link_gb_s=32, link=GEFORCE_30_LINK),
)
GPUS = {g.name.lower(): g for g in CATALOG}


def _matches(g: GPU, words: set, sm_count) -> bool:
    if not set(g.patterns) <= words or set(g.exclude) & words:
        return False
    if sm_count is not None and g.sms is not None:
        return sm_count in g.sms  # the SM count decides: it identifies the variant (or rules it out)
    return set(g.variant) <= words


def gpu_for_device(device_name: str, sm_count: int | None = None):
    """The catalog entry for a CUDA device (e.g. 'NVIDIA H100 80GB HBM3' with 132 SMs), or None.

    sm_count: the device's multi_processor_count; None looks up by name alone. Names are matched as
    whole words ("a100" does not match "A1000"); laptop chips share names with desktop ones but
    run at far lower clocks, so they are not in the table."""
    words = set(re.findall(r"[a-z0-9]+", device_name.lower()))
    if words & {"laptop", "mobile"}:
        return None
    for g in CATALOG:
        if _matches(g, words, sm_count):
            return g
    return None


def describe_peak(device_name: str, sm_count: int | None):
    """(peak FLOP/s or None, one line for the log) for a CUDA device: what MFU is measured against."""
    g = gpu_for_device(device_name, sm_count)
    sms = "" if sm_count is None else f" ({sm_count} SMs)"
    if g is None:
        return None, (f"{device_name}{sms} is not in the peak table (code/gpus.py): no MFU; "
                      f"pass --peak-tflops to get one")
    return g.peak_flops, f"{device_name}{sms} → {g.name}, {g.precision} dense peak {g.peak_flops / 1e12:g} TFLOP/s"


# ---- beyond one machine: the network, and the launcher ------------------------------------------------
DEFAULT_GPUS_PER_NODE = 8
# one 400 Gb/s InfiniBand (NDR) port per GPU, as NVIDIA's DGX H100 has (8 ConnectX-7, DGX H100 datasheet)
DEFAULT_NODE_LINK_GBIT = 400


def link_bytes_per_s(gpus: int, link_gb_s: float | None, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                     node_link_gbit: float = DEFAULT_NODE_LINK_GBIT) -> float | None:
    """Bytes per second one GPU sends in a ring: its link inside a machine; once the ring leaves the
    machine, the slower of that and the network port (a ring is as fast as its slowest hop)."""
    if link_gb_s is None:
        return None
    if gpus <= gpus_per_node:
        return link_gb_s * 1e9
    return min(link_gb_s * 1e9, node_link_gbit * 1e9 / 8)


# torchrun's flags for a preemptible run, as launch/slurm.sbatch and launch/skypilot.yaml pass them
# (tests/test_budget.py compares): forward SIGUSR1 (Slurm's notice before the time limit) as well as
# SIGTERM to the workers, and give them SHUTDOWN_TIMEOUT_S to save before torchrun kills them (its
# default is 30 s; Slurm's notice in launch/ is 180 s, so 170 leaves the job time to requeue).
SHUTDOWN_TIMEOUT_S = 170
TORCHRUN_STOP_FLAGS = ("--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
                       f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}")
