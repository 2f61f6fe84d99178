"""train_gpu.py's device: which GPU a process trains on, its precision, and its peak for MFU."""
import torch

from arguments import refuse
from gpus import describe_peak


def setup_device(args, local_rank: int) -> torch.device:
    """The device this process trains on: GPU number local_rank, or the CPU."""
    if args.device == "cuda":
        if not torch.cuda.is_available():
            refuse("--device cuda was asked for, but this machine has no CUDA GPU that torch can use; "
                   "for a smoke test on the CPU add --device cpu and a tiny config")
        if local_rank >= torch.cuda.device_count():
            refuse(f"process {local_rank} needs GPU {local_rank}, but only {torch.cuda.device_count()} are visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def peak_flops(device, override_tflops):
    """(peak FLOP/s per GPU or None, a note for the log)."""
    if device.type != "cuda":
        return None, "no MFU on CPU (no spec peak to compare with)"
    name = torch.cuda.get_device_name(device)
    if override_tflops:
        return override_tflops * 1e12, f"{name}: peak {override_tflops:g} TFLOP/s from --peak-tflops"
    return describe_peak(name, torch.cuda.get_device_properties(device).multi_processor_count)


def resolve_precision(choice: str, device: torch.device) -> str:
    """auto: bf16 where the GPU has bf16 tensor cores, fp16 (with loss scaling) where it has not, fp32 on a CPU."""
    if device.type != "cuda":
        return "fp32" if choice == "auto" else choice  # CPU autocast: slow, but the same code path
    try:  # without emulation: Volta and Turing "support" bf16 only in slow emulation
        has_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:
        has_bf16 = torch.cuda.is_bf16_supported()
    if choice == "auto":
        return "bf16" if has_bf16 else "fp16"
    if choice == "bf16" and not has_bf16:
        refuse(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 tensor cores; use fp16 or auto")
    return choice
