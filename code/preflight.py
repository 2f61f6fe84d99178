"""train_gpu.py --preflight: is this box the one the budget assumed? About a minute, before a run is paid for.

Each process measures, and rank 0 prints beside what the plan assumes, with a verdict (ok / WARN):
- matmul: each process's own, in the run's precision (bf16; fp16 on a GPU without bf16, T4 and V100;
  fp32 on a CPU), against the catalog's dense peak (code/gpus.py); one slow process (a throttling
  GPU) slows every step of the others;
- all-reduce bus bandwidth over all processes, against the link the budget assumes for this many
  machines (gpus.link_bytes_per_s: the GPU's own link inside one, the network port across several;
  machines = processes / LOCAL_WORLD_SIZE); NCCL reaches 70-90 % of a link;
- host-to-device copies from pinned memory (on a CPU: a host memory copy);
- disk in --out: its write speed (fsynced), and from it whether the worst wait before the processes
  agree on a stop (stop_poll_s) plus this run's checkpoint fit in half of --notice-s (the launcher's
  seconds from stop signal to kill, which launch/ sets); its free space against the checkpoints a run keeps
  (the last KEPT_CHECKPOINTS, and the next one written before the oldest goes);
- /dev/shm, where NCCL's processes on one machine share buffers (a container's 64 MiB fails NCCL's setup);
- free device memory (plus what this process holds) against the ledger's peak per device for training
  and for evaluation (code/memory.py);
- the GPU and NUMA topology where nvidia-smi or lscpu exist.
On a CPU the same checks run with gloo; there is no catalog peak to compare the matmul with.
train_gpu.py --preflight exits EXIT_WARNED when a check warns, so a launch script can stop there.
"""
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from checkpoint import CKPT_DIR
from checkpoint import KEEP as KEPT_CHECKPOINTS  # checkpoint.py keeps the newest two (torchtitan keeps at least two)
from gpus import gpu_for_device, link_bytes_per_s
from shapes import run_peak_bytes

MATMUL_FRACTION = 0.6  # a GPU below 60 % of its dense peak on a large matmul is throttled or mislabelled
LINK_FRACTION = 0.5  # NCCL's all-reduce bus bandwidth is typically 70-90 % of the link
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights and AdamW's two moments
STOP_POLL_S = 10  # the longest the processes may take to agree on a stop (train_gpu.py's stop poll)
EXIT_WARNED = 78  # train_gpu.py --preflight's status when a check warns (EX_CONFIG: not the box planned for)
CPU_MATMUL_N = 1024  # under a second on a CPU in fp32 (a CPU without bf16/fp16 instructions: seconds in 16 bits)
SHM_MIN_BYTES = 2**30  # NVIDIA runs its containers with --shm-size=1g or more; Docker's default is 64 MiB
MATMUL_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Assumed:
    """What the plan assumes of this box: the catalog's GPU (None: not in it, or a CPU), the precision
    the run multiplies in, and the link one GPU sends at in a ring over this many machines."""
    gpu: object
    precision: str
    nodes: int
    link_bytes_s: float | None
    link: str

    @property
    def dtype(self) -> torch.dtype:
        return MATMUL_DTYPES[self.precision]


def assumed(device_name: str | None, sm_count: int | None, precision: str, world: int, local_world: int) -> Assumed:
    """The plan for a box: device_name None is a CPU; the machines are world / local_world processes
    each, and the link is the budget's own (gpus.link_bytes_per_s) for that many."""
    gpu = None if device_name is None else gpu_for_device(device_name, sm_count)
    nodes = max(1, world // max(1, local_world))
    link = None if gpu is None else link_bytes_per_s(world, gpu.link_gb_s, gpus_per_node=max(1, local_world))
    label = "" if link is None else (gpu.link if nodes == 1 or link == gpu.link_gb_s * 1e9 else
                                     f"{nodes} machines: the network port between them, slower than {gpu.link}")
    return Assumed(gpu, precision, nodes, link, label)


def matmul_verdict(flops: list, n: int, plan: Assumed, cuda: bool) -> tuple:
    """(warned, line) for the processes' matmul FLOP/s in the run's precision."""
    unit, scale = ("TFLOP/s", 1e12) if cuda else ("GFLOP/s", 1e9)
    line = ", ".join(f"{f / scale:,.1f}" for f in flops) + " " + unit
    what = f"  matmul {n}³ {plan.precision} per process: {line}"
    if plan.gpu is not None and plan.precision in ("bf16", "fp16"):  # the catalog's peak is 16-bit
        ok = min(flops) >= MATMUL_FRACTION * plan.gpu.peak_flops
        return not ok, (f"{what}; the plan assumes {plan.gpu.peak_flops / 1e12:g} ({plan.gpu.precision} dense "
                        f"peak), warn below {MATMUL_FRACTION:.0%}: {_verdict(ok)}")
    spread = min(flops) / max(flops)  # on a CPU the processes share cores: no verdict there
    return cuda and spread < 0.8, (f"{what}; no catalog peak here; slowest/fastest {spread:.2f}"
                                   + (f" (warn below 0.80): {_verdict(spread >= 0.8)}" if cuda else ""))


def link_verdict(bus_gb_s: float, mib: float, plan: Assumed) -> tuple:
    """(warned, line) for the all-reduce's bus bandwidth against the link the budget assumes."""
    what = f"  all-reduce {mib:.0f} MiB: bus bandwidth {bus_gb_s:,.2f} GB/s"
    if plan.link_bytes_s is None:
        return False, what + " (no catalog link to compare with)"
    ok = bus_gb_s * 1e9 >= LINK_FRACTION * plan.link_bytes_s
    return not ok, (f"{what}; the budget assumes {plan.link_bytes_s / 1e9:g} GB/s per GPU over {plan.nodes} "
                    f"machine(s) ({plan.link}), warn below {LINK_FRACTION:.0%}: {_verdict(ok)}")


def disk_verdict(speed: float, free: float, held: float, part: float, stop_poll_s: float, notice_s: float) -> tuple:
    """(warnings, lines) for --out: `speed` bytes/s written, `free` bytes free, `held` bytes of the
    checkpoints already there, `part` bytes of one checkpoint this node writes, within `notice_s`."""
    save_s = part / speed
    in_time = stop_poll_s + save_s < notice_s / 2
    need = (KEPT_CHECKPOINTS + 1) * part  # the kept ones, and the next written before the oldest is deleted
    room = free + held >= need
    return (not in_time) + (not room), [
        f"  disk in --out: {speed / 1e6:,.0f} MB/s written and fsynced; this node's part of a checkpoint, "
        f"{part / 1e9:,.2f} GB, takes about {save_s:,.1f} s, after up to {stop_poll_s:g} s for the processes to "
        f"agree on the stop; the launcher's notice (--notice-s) leaves {notice_s:g} s (warn above half): "
        f"{_verdict(in_time)}",
        f"  disk space in --out: {(free + held) / 1e9:,.1f} GB free (checkpoints already there included) for "
        f"the {KEPT_CHECKPOINTS} checkpoints kept and the next being written, {need / 1e9:,.2f} GB: {_verdict(room)}"]


def shm_verdict(total: float | None, local_processes: int, cuda: bool) -> tuple:
    """(warned, line) for /dev/shm of `total` bytes (None: none) under `local_processes` per machine."""
    line = f"  /dev/shm: {(total or 0) / 2**30:,.2f} GiB for {local_processes} process(es) on this machine"
    if total is not None and cuda and local_processes > 1:  # NCCL's processes share buffers there
        ok = total >= SHM_MIN_BYTES
        return not ok, (f"{line}, warn below {SHM_MIN_BYTES / 2**30:g} GiB (docker run --shm-size=8g): "
                        + _verdict(ok))
    return False, line + " (gloo, or no NCCL peer on this machine: no verdict)"


def shm_bytes() -> float | None:
    return shutil.disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else None


def eval_peak_mib(run, n_params: int) -> float:
    """The ledger's peak while evaluating: training's without what only training holds (evaluation.Evaluator's
    forward keeps autograd's saved tensors)."""
    peak = run_peak_bytes(run, n_params)
    return (peak["total"] - sum(peak.get(k, 0) for k in ("whole grads", "partial reduce", "logit temporaries"))) / 2**20


def memory_verdict(free_mib: float, train_mib: float, eval_mib: float | None) -> tuple:
    """(warnings, lines): `free_mib` against the ledger's training peak and evaluation peak (None: no evaluation)."""
    needs = [(what, need) for what, need in (("training", train_mib), ("evaluation", eval_mib)) if need is not None]
    oks = [free_mib > 1.1 * need for _, need in needs]
    return oks.count(False), [f"  device memory for {what}: {free_mib:,.0f} MiB free (with what this process holds) "
                              f"against the ledger's {need:,.0f} MiB (+10 %): {_verdict(ok)}"
                              for (what, need), ok in zip(needs, oks)]


def _bytes_under(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


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


def run(t, ledger_mib: float, log, stop_poll_s: float = STOP_POLL_S, eval_mib: float | None = None) -> int:
    """The checks for train_gpu.py's Trainer `t` (its device, rank, world, precision, args and raw
    model); returns the number of warnings (printed by rank 0). stop_poll_s: the longest the processes
    take to agree on a stop after the signal (train_gpu.py's stop poll); eval_mib: eval_peak_mib or None."""
    device, rank, world, cuda = t.device, t.rank, t.world, t.device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else None
    plan = assumed(name, torch.cuda.get_device_properties(device).multi_processor_count if cuda else None,
                   t.precision, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    warnings = 0
    log(f"preflight: {world} process(es) on {name or 'cpu'}" + (f" → {plan.gpu.name}" if plan.gpu else "")
        + f"; the plan: {t.args.shard}, {t.precision}, ledger {ledger_mib:,.0f} MiB per device")

    n = 8192 if cuda else CPU_MATMUL_N  # large enough to reach a GPU's peak
    a, b = (torch.randn(n, n, device=device, dtype=plan.dtype) for _ in range(2))
    flops = [2 * n**3 / s for s in _per_rank(_timed(lambda: a @ b, 5 if cuda else 3, device), rank, world, device)]
    warned, line = matmul_verdict(flops, n, plan, cuda)
    warnings += warned
    log(line)

    if world > 1:
        x = torch.ones((64 if cuda else 8) * 2**20 // 4, device=device)
        s = _timed(lambda: dist.all_reduce(x), 5, device)
        warned, line = link_verdict(2 * (world - 1) / world * x.numel() * 4 / s / 1e9, x.numel() * 4 / 2**20, plan)
        warnings += warned
        log(line)
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
        part = CHECKPOINT_BYTES_PER_PARAM * t.raw.num_params() / plan.nodes
        warned, line = disk_verdict(speed, shutil.disk_usage(out).free, _bytes_under(out / CKPT_DIR), part,
                                    stop_poll_s, t.args.notice_s)
        warnings += warned
        for x in line:
            log(x)
        warned, line = shm_verdict(shm_bytes(), int(os.environ.get("LOCAL_WORLD_SIZE", world)), cuda)
        warnings += warned
        log(line)

    if cuda:  # the weights setup() made count in the ledger: add them back to what is free
        free = (torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_allocated(device)) / 2**20
        warned, lines = memory_verdict(free, ledger_mib, eval_mib)
        warnings += warned
        for x in lines:
            log(x)
    else:
        free = host_available_mib()
        if free is not None:
            log(f"  free host memory {free:,.0f} MiB (the ledger's {ledger_mib:,.0f} MiB for training, "
                f"{eval_mib or 0:,.0f} for evaluation, are per GPU)")

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


def host_available_mib() -> float | None:
    """The host memory the kernel says is available (Linux's MemAvailable), in MiB; None elsewhere. Read from
    /proc, so that the box needs nothing requirements-train.txt does not install."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
