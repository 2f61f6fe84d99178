"""Measuring: this machine's matmul peak, the timing loop, where a step's time goes (profiler
buckets), and a record of what produced a chapter's numbers. The FLOP formula lives in shapes.py
and is importable from here, beside the clock it is divided by."""
import datetime
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from script_support import accumulate_gradients
from shapes import flops_per_token  # noqa: F401  (one formula; chapters and scripts import it from here)


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


def matmul_fn(dtype=torch.float32, n: int = 2048):
    """(fn, flops): a no-argument n×n×n matmul in `dtype` and the FLOPs one call does. Time it
    together with training steps (time_steps) so that both see the same load on a shared machine."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    return (lambda: torch.mm(a, b)), 2 * n**3


def matmul_peak(dtype=torch.float32, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n×n×n matmul in `dtype` on this CPU: the practical peak to measure MFU against."""
    fn, flops = matmul_fn(dtype, n)
    stats = time_it(fn, warmup=2, repeats=repeats)
    return flops / stats["min_s"]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


# ---- timing a training step ----

def training_step_fn(model, opt, x, y, autocast_dtype=None, accum: int = 1):
    """A no-argument function that runs one optimizer step of `model` on the batch (x, y).

    autocast_dtype: None for plain fp32, or torch.bfloat16 for mixed precision (the weights, the
    gradients and the optimizer stay fp32). accum: split the batch into `accum` micro-batches,
    divide each loss by `accum` and let backward() sum the gradients (gradient accumulation).
    `model` may be a torch.compile'd module. Returns the mean loss of the micro-batches (a tensor).
    """
    if x.size(0) % accum:
        raise ValueError(f"batch {x.size(0)} is not divisible by accum={accum}")
    micro_batches = list(zip(x.chunk(accum), y.chunk(accum)))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, micro_batches, autocast_dtype=autocast_dtype)
        opt.step()
        return loss
    return step


def time_steps(fns: dict, warmup: int = 2, repeats: int = 5, rounds: int = 1) -> dict:
    """Time several step functions fairly on a shared machine.

    Each fn is first called `warmup` times (compilation, allocator, caches; reported as warmup_s).
    Then `rounds` rounds each call every fn `repeats` times in turn, so a burst of load from
    elsewhere hits all of them alike. Returns {name: time_it-style dict}; min_s is the best call.
    """
    out = {}
    for name, fn in fns.items():
        warm = []
        for _ in range(warmup):
            t0 = time.perf_counter()
            fn()
            warm.append(time.perf_counter() - t0)
        out[name] = {"warmup_s": warm, "times_s": []}
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name]["times_s"] += time_it(fn, warmup=0, repeats=repeats)["times_s"]
    for r in out.values():
        r["median_s"] = statistics.median(r["times_s"])
        r["min_s"] = min(r["times_s"])
    return out


class _quiet_fd2:
    """Silence C++-level writes to stderr (the profiler's start/stop lines) for a block."""

    def __enter__(self):
        import sys
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self._null, 2)

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        os.close(self._null)


def profile_step(fn, steps: int = 1, profile_memory: bool = False):
    """Run fn() `steps` times under torch.profiler (CPU) and return the profiler object."""
    from torch.profiler import ProfilerActivity, profile
    with _quiet_fd2():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=profile_memory) as prof:
            for _ in range(steps):
                fn()
    return prof


# A profiled op goes to the first bucket one of whose substrings occurs in its name, or else in the
# name of the nearest op that called it; an op no bucket claims is elementwise & other.
BUCKETS = (
    ("optimizer", ("Optimizer.", "adamw", "zero_grad")),
    ("softmax/CE over vocab", ("log_softmax", "LogSoftmax", "nll_loss", "NllLoss", "cross_entropy",
                               "VocabCrossEntropy")),
    ("attention", ("scaled_dot_product", "Sdpa", "ScaledDotProduct")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "MmBackward", "BmmBackward", "aten::linear")),
)
OTHER_BUCKET = "elementwise & other"
BUCKET_NAMES = tuple(name for name, _ in BUCKETS) + (OTHER_BUCKET,)


def bucket_of(evt) -> str:
    """The bucket of a profiler event: its own name or its callers' (e.g. the fill_ that zeroes
    a gradient inside cross-entropy's backward counts as cross-entropy)."""
    while evt is not None:
        for bucket, keys in BUCKETS:
            if any(k in evt.name for k in keys):
                return bucket
        evt = evt.cpu_parent
    return OTHER_BUCKET


def bucket_shares(prof) -> dict:
    """{bucket: its share of the profiled CPU time} for a torch.profiler run (e.g. profile_step's),
    from each op's self time; the shares sum to 1. Buckets no op fell into are left out."""
    self_us = {}
    for evt in prof.events():
        bucket = bucket_of(evt)
        self_us[bucket] = self_us.get(bucket, 0.0) + evt.self_cpu_time_total
    total = sum(self_us.values())
    return {k: v / total for k, v in self_us.items()}


def peak_memory(fn) -> int:
    """Bytes: the most memory fn() holds at once beyond what existed before it, measured.

    torch.profiler with profile_memory=True records every allocation and free of torch's CPU
    allocator with its size; summing them in time order gives the live bytes at every instant,
    and the maximum of that running sum is the peak. It counts tensors (activations, gradients,
    optimizer state, temporaries), not the Python interpreter or the torch library itself.
    """
    prof = profile_step(fn, profile_memory=True)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak
