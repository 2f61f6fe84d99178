"""Witness the memory ledger's description of a run (memory.Run) on train_gpu.py's own step, on the CPU.

    python -m torch.distributed.run --standalone --nproc-per-node 2 code/run_witness.py --out witness.json

For each combination below it builds the trainer exactly as train_gpu.py does (its setup), runs one
optimizer step (its train_step and optimizer_step) of a tiny model on gloo, and counts, without
editing the script:
  sent    every message FSDP2 hands to torch.distributed (all_gather_single, reduce_scatter_single),
          every bucket DDP all-reduces (through a counting comm hook on the model setup built) and every
          buffer broadcast DDP makes before a forward, in bytes and calls;
  held    rank 0's local tensors: weights, gradients (before the optimizer step), AdamW's moments (after
          it), DDP's buckets when the model's own gradient_as_bucket_view is off, FSDP's whole gradients held
          between micro-batches (at the start of each forward after the first), and the gathered
          weights still held at the end of each forward.
Rank 0 writes {"world", "runs": [{"combo": {...}, "sent": {...}, "held": {...}}]}; memory.Run with the
same settings must give the same numbers (tests/test_run_witness.py compares them to the byte).

HSDP (--shard hsdp --shard-size 2, on 4 processes only): FSDP2's all-reduce of the gradient shards across
the groups is its one dist.all_reduce with a group of its own, counted as "all_reduce"; for every message the
witness also records the ranks of its group ("groups"), so that a test launched as two machines (two
torchrun launches, LOCAL_WORLD_SIZE 2 each) sees which collectives cross between them.

sync_every is the script's own flag (--grad-sync every). bucket_view is not a flag: train_gpu.py always
sets DDP's gradient_as_bucket_view=True, which the witness reads from the model (so a script that lost it
holds buckets the plan does not count); it turns it off from outside only for the one combination that
shows what the second copy of the gradients would cost.
"""
import contextlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_gpu  # noqa: E402
from fsdp_comm import count_collectives  # noqa: E402
from script_support import Parser, fail, output_problem, process_group, write_json  # noqa: E402

TINY = {"d_model": 32, "n_layer": 2, "n_head": 2, "seq_len": 32, "micro_batch": 2, "vocab_size": 8192}
# (scheme, precision, accum, sync_every, checkpoint, bucket_view); hsdp: shard groups of HSDP_SHARD, 4 processes
COMBOS = (
    ("ddp", "fp32", 1, False, False, True),
    ("ddp", "fp32", 4, False, True, True),
    ("ddp", "bf16", 4, False, False, False),
    ("zero3", "fp32", 1, False, False, False),
    ("zero3", "fp32", 4, False, False, False),
    ("zero3", "bf16", 4, False, False, False),
    ("zero3", "bf16", 4, True, False, False),
    ("zero3", "bf16", 4, True, True, False),
    ("zero2", "bf16", 4, False, True, False),
    ("zero2", "fp32", 1, False, True, False),
    ("zero2", "bf16", 4, True, False, False),
    ("hsdp", "fp32", 1, False, False, False),
    ("hsdp", "bf16", 4, False, False, False),
    ("hsdp", "bf16", 4, True, True, False),
)
HSDP_SHARD, HSDP_WORLD = 2, 4
COMBO_KEYS = ("scheme", "precision", "accum", "sync_every", "checkpoint", "bucket_view")


class Counter:
    """Live counts of one step: DDP's all-reduces {collective: [calls, bytes]} and rank 0's held bytes.
    FSDP2's all-gathers and reduce-scatters are counted by fsdp_comm.count_collectives (chapter 8's)."""

    def __init__(self):
        self.on = False
        self.sent = {}
        self.held = {}
        self.fsdp = None  # fsdp_comm.count_collectives()'s live counts, once patched

    def reset(self):
        self.sent = {"all_reduce": [0, 0]}
        self.groups = {"all_gather": set(), "reduce_scatter": set(), "all_reduce": set()}
        self.held = {"whole grads": 0, "gathered weights": 0, "buckets": 0, "partial reduce": 0}
        self.fsdp_before = {k: list(v) for k, v in self.fsdp.items()}

    def add(self, name, nbytes):
        if self.on:
            self.sent.setdefault(name, [0, 0])
            self.sent[name][0] += 1
            self.sent[name][1] += nbytes

    def step_sent(self) -> dict:
        """This step's messages: FSDP's since reset(), then DDP's."""
        fsdp = {k: [a - b for a, b in zip(v, self.fsdp_before[k])] for k, v in self.fsdp.items()}
        return {**fsdp, **self.sent}


COUNT = Counter()


def _ranks(group) -> tuple:
    return tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(range(dist.get_world_size()))


def watch_groups() -> None:
    """Wrap FSDP2's collectives once more (over fsdp_comm's counting wrappers): the ranks of each message's
    group, and FSDP2's all-reduce across HSDP's groups, its only dist.all_reduce given a group."""
    gather, scatter, reduce = dist.all_gather_single, dist.reduce_scatter_single, dist.all_reduce

    def gathered(output, input, *args, group=None, **kwargs):
        if COUNT.on:
            COUNT.groups["all_gather"].add(_ranks(group))
        return gather(output, input, *args, group=group, **kwargs)

    def scattered(output, input, *args, group=None, **kwargs):
        if COUNT.on:
            COUNT.groups["reduce_scatter"].add(_ranks(group))
        return scatter(output, input, *args, group=group, **kwargs)

    def all_reduced(tensor, *args, group=None, **kwargs):
        if COUNT.on and group is not None:
            COUNT.add("all_reduce", _nbytes(tensor))
            COUNT.groups["all_reduce"].add(_ranks(group))
        return reduce(tensor, *args, group=group, **kwargs)

    dist.all_gather_single, dist.reduce_scatter_single, dist.all_reduce = gathered, scattered, all_reduced


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def without_bucket_view():
    """DistributedDataParallel with gradient_as_bucket_view turned off from outside (the one combination
    that shows the second copy of the gradients); every other argument as train_gpu.setup passes it."""
    from torch.nn.parallel import DistributedDataParallel

    class Copied(DistributedDataParallel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "gradient_as_bucket_view": False})

    return Copied


def count_ddp(model) -> None:
    """A comm hook on the DDP model setup built that counts each bucket it all-reduces, and its bytes held
    apart from the gradients if the model's own gradient_as_bucket_view is off."""
    def hook(state, bucket):
        buf = bucket.buffer()
        COUNT.add("all_reduce", _nbytes(buf))
        if COUNT.on and not model.gradient_as_bucket_view:
            COUNT.held["buckets"] += _nbytes(buf)
        fut = dist.all_reduce(buf.div_(dist.get_world_size()), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    model.register_comm_hook(None, hook)


@contextlib.contextmanager
def counting_broadcasts():
    """Count DDP's buffer broadcasts (dist._broadcast_coalesced, before a forward with broadcast_buffers):
    the plan sends none."""
    broadcast = dist._broadcast_coalesced

    def counted(group, tensors, buffer_size, src=0):
        COUNT.add("broadcast", sum(_nbytes(x) for x in tensors))
        return broadcast(group, tensors, buffer_size, src)
    dist._broadcast_coalesced = counted
    try:
        yield
    finally:
        dist._broadcast_coalesced = broadcast


def fsdp_groups(model):
    for m in model.modules():
        state = getattr(m, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state else None
        if group is not None:
            yield group


def fsdp_params(model):
    for group in fsdp_groups(model):
        yield from group.fsdp_params


def watch_fsdp(model) -> None:
    """Hooks on the root: whole gradients at each forward's start, gathered weights at its end."""
    def whole_grads(module, args):
        if COUNT.on:
            held = 0
            for fp in fsdp_params(model):
                acc = getattr(fp, "unsharded_accumulated_grad", None)
                if acc is None:
                    acc = getattr(fp._unsharded_param, "grad", None) if hasattr(fp, "_unsharded_param") else None
                held += 0 if acc is None else _nbytes(acc)
            COUNT.held["whole grads"] = max(COUNT.held["whole grads"], held)
            partial = sum(_nbytes(g._partial_reduce_output) for g in fsdp_groups(model)
                          if g._partial_reduce_output is not None)  # HSDP: reduce-scatters awaiting the all-reduce
            COUNT.held["partial reduce"] = max(COUNT.held["partial reduce"], partial)

    def gathered(module, args, output):
        if COUNT.on:
            held = 0
            for fp in fsdp_params(model):
                p = getattr(fp, "_unsharded_param", None)
                if p is not None and p.untyped_storage().size() > 0:
                    held += _nbytes(p)
            COUNT.held["gathered weights"] = max(COUNT.held["gathered weights"], held)

    model.register_forward_pre_hook(whole_grads)
    model.register_forward_hook(gathered)


def one_run(combo: tuple, world: int, rank: int, out_dir: str) -> dict:
    scheme, precision, accum, sync_every, checkpoint, bucket_view = combo
    tokens = accum * TINY["micro_batch"] * TINY["seq_len"] * world
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()] + [
        f"--global-batch-tokens={tokens}", "--device=cpu", f"--out={out_dir}", f"--precision={precision}",
        "--no-compile", "--steps=1"]
    argv += (["--shard=ddp"] if scheme == "ddp" else ["--shard=hsdp", f"--shard-size={HSDP_SHARD}"]
             if scheme == "hsdp" else ["--shard=fsdp"] + (["--no-reshard-after-forward"] if scheme == "zero2" else []))
    if checkpoint:
        argv.append("--checkpoint-activations")
    if sync_every:
        argv.append("--grad-sync=every")
    args = train_gpu.build_parser().parse_args(argv)
    acc = train_gpu.check_args(args, world)
    assert acc == accum, (acc, accum)
    device = torch.device("cpu")
    data = train_gpu.TokenSource(args.data, args.vocab_size, args.seq_len, args.tokenizer, rank, world)
    ddp = torch.nn.parallel.DistributedDataParallel
    if scheme == "ddp" and not bucket_view:
        torch.nn.parallel.DistributedDataParallel = without_bucket_view()
    try:
        t = train_gpu.setup(args, device, rank, world, accum, train_gpu.resolve_precision(precision, device), data)
    finally:
        torch.nn.parallel.DistributedDataParallel = ddp
    if t.sharded:
        watch_fsdp(t.raw)
    else:
        count_ddp(t.model)
    COUNT.reset()
    COUNT.on = True
    try:
        with counting_broadcasts():
            train_gpu.train_step(t, 0)
    finally:
        COUNT.on = False
    held = train_gpu.held_bytes(t)
    train_gpu.optimizer_step(t)
    held["optimizer"] = train_gpu.held_bytes(t)["optimizer"]
    held.update(COUNT.held)
    return {"combo": dict(zip(COMBO_KEYS, combo)), "sent": COUNT.step_sent(), "held": held,
            "groups": {k: sorted(map(list, v)) for k, v in COUNT.groups.items()}, "n_params": t.raw.num_params()}


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument("--schemes", nargs="+", choices=sorted({c[0] for c in COMBOS}), default=None,
                   help="witness only these schemes' combinations (default: all)")
    args = p.parse_args(argv)
    problem = output_problem(args.out)
    if problem:
        fail(f"--out: {problem}")
    with process_group("gloo") as ranks:
        if ranks.world < 2:
            fail("the witness needs two or more processes: start it with "
                 "python -m torch.distributed.run --standalone --nproc-per-node 2 code/run_witness.py --out FILE")
        COUNT.fsdp = count_collectives()
        watch_groups()
        out_dir = str(Path(args.out).with_suffix(".runs"))
        runs = [one_run(c, ranks.world, ranks.rank, out_dir) for c in COMBOS
                if (c[0] != "hsdp" or ranks.world == HSDP_WORLD) and c[0] in (args.schemes or [c[0]])]
        if ranks.rank == 0:
            write_json(args.out, {"world": ranks.world, "tiny": TINY, "hsdp_shard": HSDP_SHARD, "runs": runs,
                                  "gpus_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world))})


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
