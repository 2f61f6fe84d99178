"""Data-parallel training on CPU processes (gloo): DDP, or FSDP2 with --fsdp.

    python code/ddp_train.py --out single.pt                                   # one process, whole batch
    python -m torch.distributed.run --standalone --nproc-per-node 2 code/ddp_train.py --out ddp.pt
    python -m torch.distributed.run --standalone --nproc-per-node 2 code/ddp_train.py --fsdp --out fsdp.pt

Every step draws one global batch from a generator seeded identically on every process; the batch
is cut into --slices slices (default: one per process) and each rank takes its own. So one process
with the whole batch and N processes with a slice each see exactly the same data. Only rank 0 logs
and saves; the checkpoint holds the plain model's state, which loads into an unwrapped GPT.
"""
import argparse
import contextlib
import os
import sys
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import CorpusError, get_batch, load_tokens  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from train import configure_optimizer, lr_at  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="checkpoint path (written by rank 0 only)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--global-batch", type=int, default=8, help="sequences per step over all processes")
    p.add_argument("--slices", type=int, default=None,
                   help="cut the global batch into this many slices (default: one per process)")
    p.add_argument("--same-data", action="store_true",
                   help="the bug to recognise: every rank takes slice 0 instead of its own")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per step on each process")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip (0: off)")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--fsdp", action="store_true", help="shard parameters, gradients and optimizer state (FSDP2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a collective may wait for the other processes before failing")
    p.add_argument("--crash-rank", type=int, default=None, help="(demo) this rank dies at --fail-step")
    p.add_argument("--hang-rank", type=int, default=None, help="(demo) this rank stalls at --fail-step")
    p.add_argument("--fail-step", type=int, default=2)
    args = p.parse_args(argv)
    for name in ("steps", "global_batch", "accum", "seq_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def local_rows(args, rank: int, world: int) -> slice:
    """Which rows of the global batch this rank trains on."""
    slices = args.slices or world
    if args.global_batch % slices:
        sys.exit(f"error: --global-batch {args.global_batch} does not divide into {slices} slices")
    if world > slices:
        sys.exit(f"error: {world} processes but only {slices} slices of the batch")
    size = args.global_batch // slices
    if size % args.accum:
        sys.exit(f"error: a slice of {size} sequences does not divide into --accum {args.accum} micro-batches")
    i = 0 if args.same_data else rank
    return slice(i * size, (i + 1) * size)


def wrap(model, args, world: int):
    if world == 1:
        return model
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:  # shard block by block, then the rest (embeddings, final norm)
            fully_shard(block)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(model)  # broadcasts rank 0's parameters, then all-reduces gradients in backward


def no_grad_sync(model, args, world: int):
    """Context that skips the gradient all-reduce; it must enclose forward AND backward."""
    if world == 1:
        return contextlib.nullcontext()
    if args.fsdp:
        @contextlib.contextmanager
        def skip():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        return skip()
    return model.no_sync()


def local_numel(tensors) -> int:
    # a DTensor (FSDP2) holds only this rank's shard locally
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() for t in tensors)


def full_state(model, args, world: int) -> dict:
    """The plain GPT's state dict, whole, on rank 0 (a collective under FSDP: every rank calls it)."""
    if world == 1:
        return model.state_dict()
    if args.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model.module.state_dict()  # unwrap: keys without the "module." prefix


def save(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a reader never sees a half-written checkpoint


def main(argv=None):
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)  # two processes on two cores: one thread each
    if world > 1:
        # without a timeout a rank that never arrives would leave the others waiting forever
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    log = print if rank == 0 else (lambda *a, **k: None)
    rows = local_rows(args, rank, world)
    try:
        tokens = load_tokens().train
    except CorpusError as e:
        sys.exit(f"error: {e}")

    cfg = GPTConfig(d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head, seq_len=args.seq_len)
    torch.manual_seed(args.seed)  # same initial weights on every rank (FSDP2 does not broadcast them)
    model = wrap(GPT(cfg), args, world)
    if args.optimizer == "adamw":
        opt = configure_optimizer(model, args.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed + 1)  # same seed everywhere: same global batch

    log(f"world {world}, rows {rows.start}:{rows.stop} of {args.global_batch} on rank 0, "
        f"{'FSDP2' if args.fsdp and world > 1 else 'DDP' if world > 1 else 'single process'}, "
        f"accum {args.accum}")
    t0 = time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lr, args.warmup, args.steps)
        x, y = get_batch(tokens, args.global_batch, args.seq_len, gen)
        x, y = x[rows].contiguous(), y[rows].contiguous()
        if step == args.fail_step and rank == args.crash_rank:
            raise RuntimeError(f"rank {rank} crashed on purpose at step {step}")
        if step == args.fail_step and rank == args.hang_rank:
            time.sleep(3600)  # a stuck rank: the others' next all-reduce must time out, not wait forever
        micro = x.size(0) // args.accum
        total = 0.0
        for i in range(args.accum):
            xs, ys = x[i * micro:(i + 1) * micro], y[i * micro:(i + 1) * micro]
            last = i == args.accum - 1
            ctx = contextlib.nullcontext() if last else no_grad_sync(model, args, world)
            with ctx:  # forward inside too: DDP prepares the all-reduce during forward
                _, loss = model(xs, ys)
                (loss / args.accum).backward()
            total += loss.item() / args.accum
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            mean = torch.tensor(total)
            if world > 1:
                dist.all_reduce(mean)  # the global batch's loss, not just rank 0's slice
                mean /= world
            log(f"step {step + 1:3d}  loss {mean.item():.4f}")

    shares = torch.tensor([local_numel(model.parameters()),
                           local_numel(t for s in opt.state.values() for t in s.values() if t.dim() > 0)])
    if world > 1:
        gathered = [torch.zeros_like(shares) for _ in range(world)]
        dist.all_gather(gathered, shares)
    else:
        gathered = [shares]
    for r, (p, s) in enumerate(gathered):
        log(f"rank {r}: parameters {p.item():,}, optimizer state {s.item():,} numbers")
    state = full_state(model, args, world)
    if rank == 0 and args.out:
        save({"model": state, "config": asdict(cfg), "steps": args.steps, "world_size": world}, args.out)
        log(f"rank 0 saved {args.out.name} in {time.perf_counter() - t0:.1f} s")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
