"""The record of what produced a result, without importing torch: the git commit, this CPU in words, and
the experiment record a chapter prints (measure.print_record). train_gpu.py's run.json (run_log.py) and
the book's build (bookbuild: the provenance page, the GPU run's label) read it; measure.py re-exports it
for the chapters. Only cpu_isa and experiment_record, which describe torch's own kernels and threads,
import torch, when they are called."""
import datetime
import os
import platform
import subprocess
from pathlib import Path

EMULATION_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")  # cap the kernels' ISA


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo), or an empty set elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):  # x86, Arm
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_isa(flags: set | None = None, machine: str | None = None) -> str:
    """The vector and matrix instructions torch can use here, in words: 'AVX2', 'AVX-512 + avx512_bf16
    + AMX', 'NEON + bf16', ...; with the kernels torch picked, and any variable that caps them."""
    import torch
    flags = cpu_flags() if flags is None else flags
    machine = (machine or platform.machine()).lower()
    if machine in ("arm64", "aarch64"):
        parts = ["NEON"] + [f for f in ("sve", "bf16") if f in flags]
    else:
        parts = ["AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE/other"]
        parts += [f for f in ("avx512_bf16",) if f in flags] + (["AMX"] if "amx_bf16" in flags else [])
    text = " + ".join(parts) + f" (torch kernels: {torch.backends.cpu.get_cpu_capability()})"
    capped = [f"{v}={os.environ[v]}" for v in EMULATION_VARS if os.environ.get(v)]
    return text + (", capped by " + " ".join(capped) if capped else "")


def git_state() -> tuple[str | None, bool | None]:
    """(commit, whether tracked files have uncommitted changes) of the repository the code is in,
    or (None, None) outside one."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None, None
    if head.returncode != 0:
        return None, None
    return head.stdout.strip(), bool(dirty.stdout.strip())


def git_commit() -> str:
    """The short commit for a chapter's record, or 'unknown'."""
    commit = git_state()[0]
    return commit[:7] if commit else "unknown"


def experiment_record() -> dict:
    """What produced a chapter's numbers: when, which code, which hardware and software."""
    import torch
    rec = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "git commit": git_commit(),
        "CPU": cpu_name(),
        "ISA": cpu_isa(),
        "CPU cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        rec["GPU"] = f"{torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    return rec
