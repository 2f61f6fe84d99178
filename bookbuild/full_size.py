"""Every plan code/budget.py prints, run at its full size in this one process: rank 0 of its real world size
on torch's fake process group, its real shapes as fake tensors, its peak memory per GPU by torch's own tracker.

    python -m bookbuild.full_size                  # every printed plan (the rehearsal's enumeration), a table
    python -m bookbuild.full_size --models 124M    # some of them

What runs. For each `command  torchrun ... code/train_gpu.py ...` line that budget.plan() prints (the
rehearsal's printed_plans: each named model on the common GPUs, on 1, 8, 16 and 64 GPUs, with and without
--checkpoint-activations), train_gpu.py's own build_parser, check_args, setup, train_step and
optimizer_step run as process 0 of the command's world, unshrunk, on the `fake` process group (collectives
return at once and move nothing) under FakeTensorMode (tensors with shapes and no data), with the precision
the GPU's `--precision auto` picks. One step, begun with AdamW's moments in place as every step after the
first is, measured by torch.distributed._tools' FSDPMemTracker (FSDP, HSDP) or MemTracker
(DDP and one GPU). Its peak per GPU is set beside the memory ledger's (train_gpu.ledger_mib of the same
planned_run), with the mesh and the placements setup() built.

Only what cannot run on fake tensors or on this CPU build is shimmed, or what would only cost time:
SHIMS names each in one line, with why, and the table prints them. The findings they rest on:
  - the tracker, entered inside FakeTensorMode, counts what DTensor's sharding propagation makes to infer
    an output's global shape (it runs in the active fake mode: _sharding_prop.py, detect_fake_mode()).
    At clip_grad_norm_'s foreach norm and scaling that is every gradient at its whole, unsharded size in
    fp32: 26 GB at 7B, which made the tracker's peak with activation recomputation at width 4096 several
    times the ledger's. A GPU allocates none of it (shim "propagation");
  - destroy_process_group and a new init work in one process, but DTensor's sharding caches (Python's and
    the C++ dispatch's) key on a mesh's shape, not its rank, and hand the new group the old one's mesh
    (fake_group clears them);
  - torch's meta function of CUDA's flash attention gives its output the query's layout, where CUDA's
    kernel allocates (batch, seq, head, dim) and returns it transposed: the model's transpose().reshape is
    then a copy per block on the CPU and a view on a GPU (shim "flash").
What it does not see: the kernels themselves (autocast on CUDA, torch.compile, the CUDA flash kernel's
workspace), the CUDA context, NCCL's buffers and the allocator's fragmentation. PyTorch's own GPU tests hold
these trackers to ±10 % of CUDA's allocated peak.
"""
import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .book import REPO
from .rehearse import COMMON_GPUS, Command, printed_plans, value, world_of

sys.path.insert(0, str(REPO / "code"))

MICRO_BATCHES = 2  # the measured step's micro-batches at most: from the second on, each holds what the second does
FULL_SIZE_COUNTS = (1, 8, 16, 64)  # the plans: one GPU, one machine, two machines, eight
TOLERANCE = 0.02  # every plan's tracker peak within 2 % of the ledger
OUTPUT = REPO / "_build" / "full_size.json"
SHIMS = {
    "mesh": "init_device_mesh outside fake mode (it lists its ranks with .tolist())",
    "sampler": "Sampler.step_batches outside fake mode (.tolist() of the start positions)",
    "kernels": "model.cpu_kernels → False: the GPU's attention and loss on fake CPU tensors",
    "flash": "SDPA as CUDA's flash kernel by its fake implementation, its output in CUDA's layout",
    "propagation": "DTensor's sharding propagation in a FakeTensorMode of its own (its global-shape placeholders "
                   "are not memory a GPU holds)",
    "peak": "the trackers keep only their global peak, not each module's (for speed; breakdown=True keeps them)",
    "first step": "AdamW's moments made by optimizer_step on zero gradients, not by a first forward and backward",
    "micro-batches": f"at most {MICRO_BATCHES} per step: from the second on each holds what the second does",
    "accumulation": "the tracker's per-module statistics cleared between micro-batches (it refuses a 2nd forward)",
    "ddp": "DDP measured as its one process: its backward's all-reduce hook fails on the fake group "
           "(comm.cpp:114 internal assert); gradient_as_bucket_view adds nothing the ledger counts",
}


@dataclass
class Plan:
    """One printed command: the budget's arguments that print it and what it runs."""
    argv: list  # budget.plan's arguments
    command: Command

    @property
    def world(self) -> int:
        launches, per_node = world_of(self.command.launcher)
        return launches * per_node

    @property
    def per_node(self) -> int:
        return world_of(self.command.launcher)[1]

    def label(self) -> dict:
        a = dict(zip(self.argv[::2], self.argv[1::2]))
        return {"model": a["--model"], "gpu": a["--gpu"], "gpus": int(a["--gpus"]),
                "recompute": "--checkpoint-activations" in self.argv}


def plans(models=None, gpus=COMMON_GPUS, counts=FULL_SIZE_COUNTS) -> list:
    """Every printed command of the rehearsal's enumeration, once per distinct (command, world, precision)."""
    out, seen = [], set()
    for argv, cmd in printed_plans(models, gpus, counts):
        if cmd is None or isinstance(cmd, tuple):  # no command, or one a parser refuses (the rehearsal's)
            continue
        key = (cmd.args, world_of(cmd.launcher), _precision(dict(zip(argv[::2], argv[1::2]))["--gpu"]))
        if key not in seen:
            seen.add(key)
            out.append(Plan(argv, cmd))
    return out


# ---- the shims ---------------------------------------------------------------------------------------

def _flash_meta(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, scale=None):
    """torch's meta function of CUDA's flash attention, but with the output laid out as CUDA's kernel
    allocates it: (batch, seq, head, dim), returned transposed (aten/src/ATen/native/transformers/cuda/
    attention.cu allocates its output from the query transposed to (batch, seq, head, dim))."""
    import torch
    from torch._meta_registrations import meta__scaled_dot_product_flash_attention as meta
    out = meta(query, key, value, dropout_p, is_causal, return_debug_mask, scale)
    b, h, s, d = query.shape
    attention = torch.empty((b, s, h, d), dtype=query.dtype, device=query.device).transpose(1, 2)
    return (attention, *out[1:])


def _cuda_flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    import torch
    assert attn_mask is None and not kwargs, "the model calls SDPA without a mask"
    return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                              scale=scale)[0]


@contextlib.contextmanager
def shims():
    """SHIMS, in place while a plan runs."""
    import torch
    import torch.distributed.device_mesh as dm
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    import model
    import sampler
    real_mesh, real_batches = dm.init_device_mesh, sampler.Sampler.step_batches
    real_prop = ShardingPropagator._propagate_tensor_meta_non_cached
    real_sdpa, real_cpu = F.scaled_dot_product_attention, model.cpu_kernels

    def mesh(*a, **k):
        with unset_fake_temporarily():
            return real_mesh(*a, **k)

    def batches(self):
        with unset_fake_temporarily():
            return real_batches(self)

    def propagate(self, op_schema):
        with unset_fake_temporarily():  # DTensor then makes a FakeTensorMode of its own, which the tracker skips
            return real_prop(self, op_schema)
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_dot_product_flash_attention", _flash_meta, "Meta", allow_override=True)
    dm.init_device_mesh, sampler.Sampler.step_batches = mesh, batches
    ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    F.scaled_dot_product_attention, model.cpu_kernels = _cuda_flash, lambda x: False
    try:
        yield
    finally:
        dm.init_device_mesh, sampler.Sampler.step_batches = real_mesh, real_batches
        ShardingPropagator._propagate_tensor_meta_non_cached = real_prop
        F.scaled_dot_product_attention, model.cpu_kernels = real_sdpa, real_cpu
        lib._destroy()


@contextlib.contextmanager
def fake_group(rank: int, world: int, per_node: int):
    """This process as `rank` of `world` on torch's fake process group, LOCAL_WORLD_SIZE as torchrun sets
    it; afterwards the group destroyed and DTensor's sharding caches cleared, so that the next group starts
    afresh (destroy and init again work in one process, but the caches key on a mesh's shape, not its rank,
    and would hand a new group the old one's mesh)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore
    saved = os.environ.get("LOCAL_WORLD_SIZE")
    os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
    if world > 1:
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        prop = DTensor._op_dispatcher.sharding_propagator
        prop.propagate_op_sharding.cache.cache_clear()
        prop._propagate_tensor_meta_cached.cache_clear()
        torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch's copy of the same
        if saved is None:
            os.environ.pop("LOCAL_WORLD_SIZE", None)
        else:
            os.environ["LOCAL_WORLD_SIZE"] = saved


# ---- one plan ------------------------------------------------------------------------------------------

class _Tokens:
    """A stand-in for train_gpu's TokenSource: the sampler reads windows of zeros."""

    def __init__(self, seq_len: int):
        import torch
        self.train = torch.zeros(seq_len + 2, dtype=torch.int64)


def _precision(gpu: str) -> str:
    """What --precision auto picks on this GPU (train_gpu.resolve_precision)."""
    from gpus import GPUS
    return "bf16" if GPUS[gpu.lower()].bf16 else "fp16"


def mesh_of(t) -> str:
    """The DeviceMesh and placements of the first parameter, as setup() built them."""
    p = next(t.raw.parameters())
    if not hasattr(p, "device_mesh"):
        return "DDP" if t.world > 1 else "1 process"
    m = p.device_mesh
    dims = "×".join(f"{n}:{s}" for n, s in zip(m.mesh_dim_names or ("shard",) * m.ndim, m.shape))
    return f"mesh {dims} {', '.join(type(x).__name__ for x in p.placements)}"


def simulate(script_args, world: int, per_node: int, gpu: str = "H100", breakdown: bool = False) -> dict:
    """train_gpu.py with these arguments as process 0 of `world` on the fake group, two steps under fake
    tensors, the second under torch's memory tracker: {'tracker', 'ledger' (MiB), 'mesh', 'accum', ...}."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    import train_gpu
    args = train_gpu.build_parser().parse_args([*script_args, "--device", "cpu"])
    with fake_group(0, world, per_node):
        accum = train_gpu.check_args(args, world)
        precision = _precision(gpu)
        run = train_gpu.planned_run(args, world, accum, precision)
        sharded = run.sharded
        ranks = world if sharded else 1  # DDP: shim "ddp", its one process
        if not sharded and dist.is_initialized():
            dist.destroy_process_group()
        device = torch.device("cpu")
        with shims(), FakeTensorMode(allow_non_fake_inputs=True):
            micro = min(accum, MICRO_BATCHES)  # shim "micro-batches"
            args.global_batch_tokens = args.micro_batch * args.seq_len * ranks * micro
            t = train_gpu.setup(args, device, 0, ranks, micro, precision, _Tokens(args.seq_len))
            t.model.train()
            for p in t.raw.parameters():  # shim "first step": AdamW's moments from zero gradients
                p.grad = torch.zeros_like(p)
            train_gpu.optimizer_step(t)
            tracker = FSDPMemTracker(t.model, t.opt) if sharded else MemTracker()
            if not breakdown:
                _global_peak_only(tracker)
            with tracker:
                if not sharded:
                    tracker.track_external(t.model, t.opt)
                if micro > 1:
                    _reset_between_micro_batches(t, tracker)
                train_gpu.train_step(t, 1)
                train_gpu.optimizer_step(t)
            peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
            out = {"tracker": peak["Total"] / 2**20,
                   "parts": {str(getattr(k, "value", k)): v / 2**20 for k, v in peak.items() if v},
                   "mesh": mesh_of(t), "accum": accum, "precision": precision}
            if breakdown:
                out["modules"] = _module_peaks(tracker)
    out["ledger"] = train_gpu.ledger_mib(run, _param_count(args))
    out["ratio"] = out["tracker"] / out["ledger"]
    out["scheme"] = run.scheme if run.gpus > 1 else "1 GPU"
    out["micro_batch"] = args.micro_batch
    return out


def _param_count(args) -> int:
    from shapes import param_count
    return param_count(args.d_model, args.n_layer, args.vocab_size)


def _global_peak_only(tracker) -> None:
    """Shim "peak": the tracker keeps only its global peak. At every operation it also updates the peak of
    each module it has seen (MemTracker: every module; at 1.3B three quarters of the run's time); the
    table reads the global one. The same comparison as torch's _update_peak_stats, without the modules."""
    from copy import deepcopy

    def update(peak_state) -> None:
        for dev, snap in tracker._curr_mem_snap.items():
            if tracker._peak_mem.get(dev, 0) < snap["Total"]:
                tracker._peak_mem[dev] = snap["Total"]
                tracker._peak_mem_snap[dev] = deepcopy(snap)
    tracker._update_peak_stats = update


class _MicroBatches(list):
    """The step's micro-batches; before each after the first, the tracker's per-module statistics are
    cleared (the trackers refuse a second forward of the root in one tracked span; the peak is kept)."""

    def __iter__(self):
        for i, batch in enumerate(super().__iter__()):
            if i:
                self.tracker.reset_mod_stats()
            yield batch


def _reset_between_micro_batches(t, tracker) -> None:
    real = t.sampler.step_batches

    def step_batches():
        out = _MicroBatches(real())
        out.tracker = tracker
        return out
    t.sampler.step_batches = step_batches


def _module_peaks(tracker) -> dict:
    out = {}
    for stats in tracker.memory_tracking.values():
        snaps = stats.snapshots
        out[stats.mod_fqn] = {str(state): [{k: v / 2**20 for k, v in next(iter(s.values())).items() if v}
                                           for s in snap_list] for state, snap_list in snaps.items()}
    return out


# ---- the table -----------------------------------------------------------------------------------------

def table_rows(selected: list, log=print, rows=None) -> list:
    """One row per plan (simulate), each handed to log as a line of the table as soon as it is measured."""
    rows = [] if rows is None else rows
    for plan in selected:
        t0 = time.perf_counter()
        label = plan.label()
        r = simulate(plan.command.args, plan.world, plan.per_node, label["gpu"])
        row = {**label, "world": plan.world, **{k: r[k] for k in ("scheme", "micro_batch", "accum", "mesh",
                                                                  "ledger", "tracker", "ratio", "parts")},
               "seconds": round(time.perf_counter() - t0, 2)}
        rows.append(row)
        log(line(row))
    return rows


HEADER = ("| model | GPU | GPUs | scheme | recompute | micro-batch | accum | mesh | ledger MiB | tracker MiB | ratio "
          "| s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def line(r: dict) -> str:
    return (f"| {r['model']} | {r['gpu']} | {r['gpus']} | {r['scheme']} | {'on' if r['recompute'] else 'off'} | "
            f"{r['micro_batch']} | {r['accum']} | {r['mesh']} | {r['ledger']:,.1f} | {r['tracker']:,.1f} | "
            f"{r['ratio']:.3f} | {r['seconds']:.1f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bookbuild.full_size", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", help="named models (default: every one of budget.MODELS)")
    p.add_argument("--gpus", nargs="*", default=list(COMMON_GPUS), help="GPU names (default: %(default)s)")
    p.add_argument("--counts", nargs="*", type=int, default=list(FULL_SIZE_COUNTS))
    p.add_argument("--output", type=Path, default=OUTPUT, help="the JSON table (the Markdown table beside it)")
    p.add_argument("--sharded-first", action="store_true",
                   help="the FSDP and HSDP plans first (seconds each; DDP's and one GPU's, under MemTracker, longer)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    selected = plans(args.models, tuple(args.gpus), tuple(args.counts))
    if args.sharded_first:
        selected.sort(key=lambda plan: plan.world == 1 or value(plan.command.args, "--shard") in (None, "ddp"))
    print("shims: " + "; ".join(f"{k}: {v}" for k, v in SHIMS.items()) + "\n")
    print(HEADER, flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    rows = []

    def log(text):
        print(text, flush=True)
        args.output.write_text(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - t0, 1),
                                           "shims": SHIMS}, ensure_ascii=False, indent=1))
    rows = table_rows(selected, log, rows)
    total = time.perf_counter() - t0
    bad = [r for r in rows if abs(r["ratio"] - 1) > TOLERANCE]
    print(f"\n{len(rows)} plans in {total:.0f} s; {len(bad)} outside ±{TOLERANCE:.0%} of the ledger")
    args.output.write_text(json.dumps({"rows": rows, "seconds": round(total, 1), "shims": SHIMS},
                                      ensure_ascii=False, indent=1))
    args.output.with_suffix(".md").write_text("\n".join([
        HEADER, *map(line, rows), "", f"{len(rows)} plans in {total:.0f} s; {len(bad)} outside ±{TOLERANCE:.0%}",
        "", *(f"- shim {k}: {v}" for k, v in SHIMS.items())]) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
