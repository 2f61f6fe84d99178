"""A training run of train_gpu.py at its full size, in this one process: rank 0 of its real world size on
torch's fake process group, its real shapes as fake tensors, its peak memory per GPU by torch's own tracker,
set beside the memory ledger's. Chapter 12 runs a few of the budget's printed plans through it;
bookbuild/full_size.py runs every one (python -m bookbuild.full_size).

    simulate(script_args, world, per_node, gpu)    # train_gpu.py's arguments: {'tracker', 'ledger' (MiB), ...}
    simulate_plan(["--model", "7B", "--gpus", "64"])   # the command budget.py prints for these arguments

What runs. train_gpu.py's own build_parser, check_args, setup, train_step and optimizer_step run as process
0 of the command's world, unshrunk, on the `fake` process group (collectives return at once and move
nothing) under FakeTensorMode (tensors with shapes and no data), with the precision the GPU's
`--precision auto` picks. One step, begun with AdamW's moments in place as every step after the first is,
measured by torch.distributed._tools' FSDPMemTracker (FSDP, HSDP) or MemTracker (DDP and one GPU). Its
peak per GPU is set beside the memory ledger's (train_gpu.ledger_mib of the same planned_run), with the mesh
and the placements setup() built.

Only what cannot run on fake tensors or on a CPU build is shimmed, or what would only cost time: SHIMS
names each in one line, with why. The findings they rest on:
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
these trackers to ±10 % of CUDA's peak of active bytes, `active_bytes.all.peak` (assertAlmostEqual(tracker /
CUDA, 1.0, delta=0.1) in test/distributed/_tools/test_mem_tracker.py and test_fsdp2_mem_tracker.py of
PyTorch's repository, on small models of a few layers).

Needs torch only where a function is called; not needed on a rented box (train_gpu.py does not import it).
"""
import contextlib
import os
import shlex
import warnings

MICRO_BATCHES = 2  # the measured step's micro-batches at most: from the second on, each holds what the second does
TOLERANCE = 0.02  # every plan's tracker peak within 2 % of the ledger
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
def local_world(per_node: int):
    """LOCAL_WORLD_SIZE as torchrun sets it (train_gpu.py reads a machine's processes from it)."""
    saved = os.environ.get("LOCAL_WORLD_SIZE")
    os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("LOCAL_WORLD_SIZE", None)
        else:
            os.environ["LOCAL_WORLD_SIZE"] = saved


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
    with local_world(per_node):
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


# ---- one run -----------------------------------------------------------------------------------------

class _Tokens:
    """A stand-in for train_gpu's TokenSource: the sampler reads windows of zeros."""

    def __init__(self, seq_len: int):
        import torch
        self.train = torch.zeros(seq_len + 2, dtype=torch.int64)


def precision_of(gpu: str) -> str:
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


def planned(script_args, world: int, per_node: int, gpu: str) -> tuple:
    """(train_gpu.py's parsed arguments, accumulation, precision, shapes.Run): the run as the ledger describes
    it, read by train_gpu.py's own parser, check_args and planned_run."""
    import train_gpu
    args = train_gpu.build_parser().parse_args([*script_args, "--device", "cpu"])
    with local_world(per_node):
        accum = train_gpu.check_args(args, world)
        precision = precision_of(gpu)
        return args, accum, precision, train_gpu.planned_run(args, world, accum, precision)


def scheme_of(run) -> str:
    return run.scheme if run.gpus > 1 else "1 GPU"


def simulate(script_args, world: int, per_node: int, gpu: str = "H100", breakdown: bool = False) -> dict:
    """train_gpu.py with these arguments as process 0 of `world` on the fake group, two steps under fake
    tensors, the second under torch's memory tracker: {'tracker', 'ledger' (MiB), 'mesh', 'accum', ...}."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    import train_gpu
    args, accum, precision, run = planned(script_args, world, per_node, gpu)
    with fake_group(0, world, per_node), warnings.catch_warnings():
        # train_gpu.py sets its step timeout on every group; torch warns that the fake one, being neither
        # nccl nor gloo, ignores it
        warnings.filterwarnings("ignore", "Set timeout is now only supported", UserWarning)
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
    out["ledger"] = train_gpu.ledger_mib(run, param_count_of(args))
    out["ratio"] = out["tracker"] / out["ledger"]
    out["scheme"] = scheme_of(run)
    out["micro_batch"] = args.micro_batch
    return out


def printed_commands(budget_argv: list) -> list:
    """The `torchrun ... code/train_gpu.py ...` lines budget.py prints for these arguments (none where
    nothing fits)."""
    import budget
    return command_lines_in(budget.plan(budget_argv)["text"])


def command_lines_in(text: str) -> list:
    """The `torchrun ...` lines of budget.py's output."""
    return [x.split(None, 1)[1] for x in text.splitlines() if x.startswith("command ") and " torchrun " in x]


def printed_world(line: str) -> tuple:
    """(train_gpu.py's arguments, world, processes per machine) of a `torchrun ... code/train_gpu.py ...`
    line, read by torchrun's own parser."""
    from torch.distributed.run import get_args_parser
    ns = get_args_parser().parse_args(shlex.split(line)[1:])
    per_node = int(ns.nproc_per_node)
    return list(ns.training_script_args), int(str(ns.nnodes).split(":")[-1]) * per_node, per_node


def simulate_plan(budget_argv: list) -> dict:
    """simulate() of the command budget.py prints for these arguments, on its --gpu: the last command it
    prints (the one it chose), with 'command' (that line) and 'world'."""
    import budget
    plan = budget.plan(budget_argv)
    line = command_lines_in(plan["text"])[-1]
    script_args, world, per_node = printed_world(line)
    return {**simulate(script_args, world, per_node, plan["args"].gpu), "command": line, "world": world}


def param_count_of(args) -> int:
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
