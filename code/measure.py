"""Measuring: the FLOP formula, this machine's matmul peak, the timing loop, and a record of what
produced a chapter's numbers. Chapters 2, 3, 6 and 7 and the scripts all use these."""
import datetime
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch


def flops_per_token(cfg, n_params: int) -> int:
    """Training FLOPs per token: 6N for the weights (forward 2N, backward 4N) plus attention's
    QKᵀ and PV, 12·L·T·d, which no parameter counts."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.seq_len * cfg.d_model


def time_it(fn, warmup: int = 2, repeats: int = 5) -> dict:
    """Call fn() `warmup` times untimed (compilation, allocator, caches), then `repeats` times timed.

    Returns the warm-up seconds of each warm-up call and the median and min of the timed calls in
    seconds. The median resists a stray slow call from elsewhere on the machine.
    """
    warm = []
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - t0)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"warmup_s": warm, "median_s": statistics.median(times), "min_s": min(times), "times_s": times}


def matmul_peak(dtype=torch.float32, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n×n×n matmul in `dtype` on this CPU: the practical peak to measure MFU against."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    stats = time_it(lambda: torch.mm(a, b), warmup=2, repeats=repeats)
    return 2 * n**3 / stats["min_s"]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def experiment_record() -> dict:
    """What produced a chapter's numbers: when, which code, which hardware and software."""
    rec = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "git commit": git_commit(),
        "CPU": cpu_name(),
        "CPU cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        rec["GPU"] = f"{torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    return rec


def print_record() -> None:
    for k, v in experiment_record().items():
        print(f"{k:>13}: {v}")


def glue_measured(name: str, value, fmt: str = "") -> None:
    """Glue a machine-dependent value as preformatted text.

    Stored as a quoted string, which tests/nbval_sanitize.cfg masks; deterministic values are glued
    as numbers with myst_nb.glue directly and are compared exactly.
    """
    from myst_nb import glue
    glue(name, format(value, fmt), display=False)
