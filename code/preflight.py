"""train_gpu.py --preflight: is this box the one the budget assumed? About a minute, before a run is paid for.

Each process measures, and rank 0 prints beside what the plan assumes, with a verdict (ok / WARN):
- matmul: each process's own (bf16 on a GPU, fp32 on a CPU) against the catalog's dense peak
  (code/gpus.py); one slow process (a throttling GPU) slows every step of the others;
- all-reduce bus bandwidth over all processes, against the catalog's link (NCCL reaches 70-90 %);
- host-to-device copies from pinned memory (on a CPU: a host memory copy);
- disk write speed in --out (fsynced), and from it how long this run's checkpoint takes against the
  170 s launch/ gives torchrun's --shutdown-timeout after a preemption notice;
- free device memory against the memory ledger's peak per device (code/memory.py);
- the GPU and NUMA topology where nvidia-smi or lscpu exist.
On a CPU the same checks run with gloo; there is no catalog peak to compare the matmul with.
"""
import os
import shutil
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gpus import gpu_for_device

MATMUL_FRACTION = 0.6  # a GPU below 60 % of its dense peak on a large matmul is throttled or mislabelled
LINK_FRACTION = 0.5  # NCCL's all-reduce bus bandwidth is typically 70-90 % of the link
SHUTDOWN_S = 170  # launch/'s --shutdown-timeout: the time a checkpoint has after a preemption notice
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights and AdamW's two moments


def _timed(fn, repeats: int, device) -> float:
    """Seconds per call of fn after one warm-up call."""
    fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


def _per_rank(value: float, rank: int, world: int, device) -> list:
    """Every process's value, on every process (one all-reduce)."""
    x = torch.zeros(world, dtype=torch.float64, device=device)
    x[rank] = value
    if dist.is_initialized():
        dist.all_reduce(x)
    return x.tolist()


def _verdict(ok: bool) -> str:
    return "ok" if ok else "WARN"


def run(t, ledger_mib: float, log) -> int:
    """The checks for train_gpu.py's Trainer `t`; returns the number of warnings (printed by rank 0)."""
    device, rank, world, cuda = t.device, t.rank, t.world, t.device.type == "cuda"
    gpu = gpu_for_device(torch.cuda.get_device_name(device),
                         torch.cuda.get_device_properties(device).multi_processor_count) if cuda else None
    warnings = 0
    log(f"preflight: {world} process(es) on {torch.cuda.get_device_name(device) if cuda else 'cpu'}"
        + (f" → {gpu.name}" if gpu else "") + f"; the plan: {t.args.shard}, ledger {ledger_mib:,.0f} MiB per device")

    n = 8192 if cuda else 1024  # large enough to reach a GPU's peak; under a second on a CPU
    dtype = torch.bfloat16 if cuda else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    flops = [2 * n**3 / s for s in _per_rank(_timed(lambda: a @ b, 5 if cuda else 3, device), rank, world, device)]
    unit, scale = ("TFLOP/s", 1e12) if cuda else ("GFLOP/s", 1e9)
    line = ", ".join(f"{f / scale:,.1f}" for f in flops) + " " + unit
    if gpu is not None:
        ok = min(flops) >= MATMUL_FRACTION * gpu.peak_flops
        warnings += not ok
        log(f"  matmul {n}³ bf16 per process: {line}; the plan assumes {gpu.peak_flops / 1e12:g} dense peak, "
            f"warn below {MATMUL_FRACTION:.0%}: {_verdict(ok)}")
    else:
        spread = min(flops) / max(flops)  # on a CPU the processes share cores: no verdict there
        warnings += cuda and spread < 0.8
        log(f"  matmul {n}³ {'bf16' if cuda else 'fp32'} per process: {line}; no catalog peak here; slowest/"
            f"fastest {spread:.2f}" + (f" (warn below 0.80): {_verdict(spread >= 0.8)}" if cuda else ""))

    if world > 1:
        x = torch.ones((64 if cuda else 8) * 2**20 // 4, device=device)
        s = _timed(lambda: dist.all_reduce(x), 5, device)
        bus = 2 * (world - 1) / world * x.numel() * 4 / s / 1e9
        if gpu is not None and gpu.link_gb_s:
            ok = bus >= LINK_FRACTION * gpu.link_gb_s
            warnings += not ok
            log(f"  all-reduce {x.numel() * 4 / 2**20:.0f} MiB: bus bandwidth {bus:,.1f} GB/s; the catalog's link "
                f"{gpu.link_gb_s:g} GB/s ({gpu.link}), warn below {LINK_FRACTION:.0%}: {_verdict(ok)}")
        else:
            log(f"  all-reduce {x.numel() * 4 / 2**20:.0f} MiB: bus bandwidth {bus:,.2f} GB/s (no catalog link to "
                "compare with)")
    else:
        log("  all-reduce: one process, nothing to measure")

    host = torch.empty(256 * 2**20 // 4)
    if cuda:
        host = host.pin_memory()
        s = _timed(lambda: host.to(device, non_blocking=True), 5, device)
        log(f"  host-to-device, pinned: {host.numel() * 4 / s / 1e9:,.1f} GB/s per process (PCIe 4.0 x16 gives "
            "about 25, 5.0 about 50; far less: pinned memory is off or the GPU sits on the wrong NUMA node)")
    else:
        s = _timed(lambda: host.clone(), 3, device)
        log(f"  host memory copy (no device here): {host.numel() * 4 / s / 1e9:,.1f} GB/s")

    if rank == 0:
        out = Path(t.args.out)
        out.mkdir(parents=True, exist_ok=True)
        probe, size = out / ".preflight.tmp", (512 if cuda else 64) * 2**20
        block = os.urandom(2**20)
        try:
            start = time.perf_counter()
            with open(probe, "wb") as f:
                for _ in range(size // len(block)):
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
            speed = size / (time.perf_counter() - start)
        finally:
            probe.unlink(missing_ok=True)
        ckpt = CHECKPOINT_BYTES_PER_PARAM * t.raw.num_params() * int(os.environ.get("LOCAL_WORLD_SIZE", 1)) / world
        ok = ckpt / speed < SHUTDOWN_S / 2
        warnings += not ok
        log(f"  disk in --out: {speed / 1e6:,.0f} MB/s written and fsynced; this node's part of a checkpoint, "
            f"{ckpt / 1e9:,.2f} GB, takes about {ckpt / speed:,.1f} s; after a preemption notice there are "
            f"{SHUTDOWN_S} s (warn above half): {_verdict(ok)}")

    if cuda:
        free = torch.cuda.mem_get_info(device)[0] / 2**20
        ok = free > 1.1 * ledger_mib
        log(f"  free device memory {free:,.0f} MiB against the ledger's {ledger_mib:,.0f} MiB (+10 %): {_verdict(ok)}")
    else:
        try:
            import psutil
            free, ok = psutil.virtual_memory().available / 2**20, True
            log(f"  free host memory {free:,.0f} MiB (the ledger's {ledger_mib:,.0f} MiB per device is for a GPU)")
        except ImportError:
            ok = True
    warnings += not ok

    for tool, cmd in (("nvidia-smi", ["nvidia-smi", "topo", "-m"]), ("lscpu", ["lscpu"])):
        if shutil.which(tool) and rank == 0:
            try:
                text = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            lines = text.splitlines() if tool == "nvidia-smi" else [x for x in text.splitlines() if "NUMA" in x]
            for x in lines[:12]:
                log(f"  {tool}: {x.strip()}")
    log(f"preflight: {warnings} warning(s); " + ("the box matches the plan" if not warnings else
                                                   "check the lines marked WARN before paying for the run"))
    return warnings
