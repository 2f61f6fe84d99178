"""Data-parallel training on CPU processes (gloo): DDP, or FSDP2 with --fsdp.

    python code/ddp_train.py --out single.pt                                   # one process, whole batch
    python -m torch.distributed.run --standalone --nproc-per-node 2 code/ddp_train.py --out ddp.pt
    python -m torch.distributed.run --standalone --nproc-per-node 2 code/ddp_train.py --fsdp --out fsdp.pt
    python -m torch.distributed.run --standalone --nproc-per-node 2 code/ddp_train.py --accum 4 --count-all-reduce
    python -m torch.distributed.run --standalone --nproc-per-node 2 code/ddp_train.py --show-data-order
    python -m torch.distributed.run --standalone --nproc-per-node 2 code/ddp_train.py --bench-all-reduce

Every step draws one global batch from a generator seeded identically on every process; the batch
is cut into --slices slices (default: one per process) and each rank takes its own. So one process
with the whole batch and N processes with a slice each see exactly the same data. Only rank 0 logs
and saves; the checkpoint holds the plain model's state, which loads into an unwrapped GPT.

Two demonstrations of bugs that raise no error: --backward-only-no-sync (with --count-all-reduce
to see what it costs) and --show-data-order (DistributedSampler with and without set_epoch, and a
plain shuffled DataLoader; no training).

--bench-all-reduce times the collective DDP is built on, an all-reduce of fp32 tensors from kilobytes
to tens of megabytes, and fits the ring model t = α + 2(G-1)/G · M / W to the fastest calls.
"""
import contextlib
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import get_batch, load_tokens_or_exit  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from optimizer import configure_optimizer, lr_at  # noqa: E402
from script_support import (  # noqa: E402
    Parser,
    accumulate_gradients,
    fail,
    mean_across_ranks,
    number,
    positive,
    positive_int,
    process_group,
    save_atomic,
    set_lr,
)


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="checkpoint path (written by rank 0 only)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--global-batch", type=int, default=8, help="sequences per step over all processes")
    p.add_argument("--slices", type=int, default=None,
                   help="cut the global batch into this many slices (default: one per process)")
    p.add_argument("--same-data", action="store_true",
                   help="the bug to recognise: every rank takes slice 0 instead of its own")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per step on each process")
    p.add_argument("--backward-only-no-sync", action="store_true",
                   help="the bug to recognise: no_sync encloses only backward, forward runs outside it (DDP)")
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="DDP gathers gradients into buckets of about this size, one all-reduce each")
    p.add_argument("--count-all-reduce", action="store_true",
                   help="count DDP's gradient all-reduces per step (a communication hook) and print them")
    p.add_argument("--show-data-order", action="store_true",
                   help="(demo) print which windows each rank reads under three loading schemes; no training")
    p.add_argument("--bench-all-reduce", action="store_true",
                   help="(measure) time all-reduce at several message sizes and fit the ring model; no training")
    p.add_argument("--sizes", type=byte_sizes, default=BENCH_SIZES,
                   help=f"with --bench-all-reduce: message sizes in bytes, comma-separated (default {BENCH_SIZES})")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="with --bench-all-reduce: timed calls per size per round")
    p.add_argument("--rounds", type=positive_int, default=10,
                   help="with --bench-all-reduce: at most this many rounds over all sizes (a burst of load hits "
                        "every size alike); as many as fit --budget-s, at least 2")
    p.add_argument("--budget-s", type=positive, default=20.0,
                   help="with --bench-all-reduce: seconds the timed calls may take (default 20)")
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
    for name in ("steps", "global_batch", "accum", "seq_len", "repeats", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.fsdp and (args.backward_only_no_sync or args.count_all_reduce):
        p.error("--backward-only-no-sync and --count-all-reduce are about DDP; drop --fsdp")
    return args


BENCH_SIZES = "4k,16k,64k,256k,1M,4M,16M,64M"  # decimal: 4 kB to 64 MB, four times apart


def byte_sizes(text: str) -> list:
    """'4k,1M' -> [4000, 1000000]: message sizes in bytes, each a whole number of fp32 values."""
    import argparse
    sizes = [number(t) for t in text.split(",")]
    for t, b in zip(text.split(","), sizes):
        if b < 4 or b % 4:
            raise argparse.ArgumentTypeError(f"{t.strip()!r} is not a whole number of 4-byte fp32 values")
    return [int(b) for b in sizes]


def local_rows(args, rank: int, world: int) -> slice:
    """Which rows of the global batch this rank trains on."""
    slices = args.slices or world
    if args.global_batch % slices:
        fail(f"--global-batch {args.global_batch} does not divide into {slices} slices")
    if world > slices:
        fail(f"{world} processes but only {slices} slices of the batch")
    size = args.global_batch // slices
    if size % args.accum:
        fail(f"a slice of {size} sequences does not divide into --accum {args.accum} micro-batches")
    i = 0 if args.same_data else rank
    return slice(i * size, (i + 1) * size)


def wrap(model, args, world: int):
    """The model as this run trains it: plain (one process), under DDP, or sharded by FSDP2."""
    if world == 1:
        return model
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:  # shard block by block, then the rest (embeddings, final norm)
            fully_shard(block)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel as DDP
    # broadcasts rank 0's parameters, then all-reduces gradients in backward, bucket by bucket
    return DDP(model, bucket_cap_mb=args.bucket_mb)


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


def accumulate_backward_only_in_no_sync(model, micro_batches, no_sync) -> torch.Tensor:
    """The bug to recognise: accumulate_gradients with forward moved outside no_sync.

    DDP arms the all-reduce of a backward during the forward before it, so here every
    micro-batch's backward all-reduces; no_sync around backward alone changes nothing."""
    n = len(micro_batches)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        _, loss = model(x, y)  # outside no_sync: this backward's all-reduce is already armed
        with contextlib.nullcontext() if i == n - 1 else no_sync():
            (loss / n).backward()
        total = total + loss.detach() / n
    return total


def count_all_reduces(model) -> list:
    """Make DDP all-reduce through a communication hook that records each call's bucket (index,
    whether it is the last bucket of this backward).

    The hook does what DDP does without one (default_hooks.allreduce_hook: divide by the number of
    processes, all-reduce); DDP calls it once per gradient bucket each time a backward all-reduces.
    Returns the list the hook appends to; the caller empties it after each step."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    calls = []

    def hook(state, bucket):
        calls.append((bucket.index(), bucket.is_last()))
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)  # state None: the default process group
    return calls


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


def checkpoint_difference(path_a, path_b) -> float:
    """The largest |Δθ| over all parameters of the models in two of this script's checkpoints."""
    a, b = (torch.load(path, weights_only=True)["model"] for path in (path_a, path_b))
    if a.keys() != b.keys():
        raise ValueError(f"{path_a} and {path_b} hold different parameters")
    return max((a[k] - b[k]).abs().max().item() for k in a)


def train_step(model, opt, x, y, args, world: int) -> float:
    """One optimizer step on this rank's rows x, y; returns their mean loss.

    The rows are cut into --accum micro-batches; the gradients are all-reduced once, after the
    last of them, so the step equals one on the whole global batch."""
    micro_batches = list(zip(x.chunk(args.accum), y.chunk(args.accum)))
    accumulate = accumulate_backward_only_in_no_sync if args.backward_only_no_sync else accumulate_gradients
    loss = accumulate(model, micro_batches, no_sync=lambda: no_grad_sync(model, args, world))
    if args.clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)  # two processes on two cores: one thread each
    # without a timeout a rank that never arrives would leave the others waiting forever
    with process_group("gloo", timeout_s=args.timeout) as (rank, _, world):
        if args.show_data_order:
            show_data_order(args, rank, world)
        elif args.bench_all_reduce:
            report_all_reduce(args, rank, world)
        else:
            run(args, rank, world)


def run(args, rank: int, world: int):
    log = print if rank == 0 else (lambda *a, **k: None)
    rows = local_rows(args, rank, world)
    tokens = load_tokens_or_exit().train

    cfg = GPTConfig(d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head, seq_len=args.seq_len)
    torch.manual_seed(args.seed)  # same initial weights on every rank (FSDP2 does not broadcast them)
    model = wrap(GPT(cfg), args, world)
    all_reduces = count_all_reduces(model) if args.count_all_reduce and world > 1 else None
    calls_per_step = []
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
        set_lr(opt, lr_at(step, args.lr, args.warmup, args.steps))
        x, y = get_batch(tokens, args.global_batch, args.seq_len, gen)
        x, y = x[rows].contiguous(), y[rows].contiguous()
        if step == args.fail_step and rank == args.crash_rank:
            raise RuntimeError(f"rank {rank} crashed on purpose at step {step}")
        if step == args.fail_step and rank == args.hang_rank:
            time.sleep(3600)  # a stuck rank: the others' next all-reduce must time out, not wait forever
        loss = train_step(model, opt, x, y, args, world)
        if all_reduces is not None:
            calls_per_step.append(list(all_reduces))
            all_reduces.clear()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            mean = mean_across_ranks(torch.tensor(loss))  # the global batch's loss, not just rank 0's slice
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
    if calls_per_step:
        log_all_reduce_counts(calls_per_step, log)
    state = full_state(model, args, world)
    if rank == 0 and args.out:
        save_atomic({"model": state, "config": asdict(cfg), "steps": args.steps, "world_size": world}, args.out)
        log(f"rank 0 saved {args.out.name} in {time.perf_counter() - t0:.1f} s")
    if world > 1:
        dist.barrier()  # the others wait until rank 0 has saved


def log_all_reduce_counts(calls_per_step, log):
    """One line per distinct count: the bucket all-reduces of a step, and how many backward passes
    (micro-batches) made them. DDP regroups its buckets once, after the first backward that
    all-reduces, so the first step may count differently from the rest."""
    counts = {}
    for step, calls in enumerate(calls_per_step, 1):
        synced = sum(last for _, last in calls)  # each all-reducing backward ends with the last bucket
        counts.setdefault((len(calls), synced, len({i for i, _ in calls})), []).append(step)
    for (n, synced, buckets), steps in counts.items():
        where = f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}"
        split = (f"buckets {buckets} × micro-batches {synced}" if n == buckets * synced
                 else f"micro-batches {synced}, buckets regrouped within the step")
        log(f"all-reduce calls per step: {n} ({split}), {where}")


# ---- which data each rank reads: a map-style dataset and a sampler ----

class Windows(torch.utils.data.Dataset):
    """A token stream cut into non-overlapping windows of seq_len + 1 tokens; item i is (x, y)."""

    def __init__(self, tokens, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self):
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i):
        w = self.tokens[i * self.seq_len: (i + 1) * self.seq_len + 1]
        return w[:-1], w[1:]


def show_data_order(args, rank: int, world: int, n_windows: int = 16, epochs: int = 3, batch: int = 4):
    """For three ways to load a map-style dataset, the window indices each rank reads, epoch by
    epoch; rank 0 prints them and, with --out, saves {scheme: [[rank 0's order, ...] per epoch]}."""
    from torch.utils.data import DataLoader, DistributedSampler
    tokens = load_tokens_or_exit().train
    data = Windows(tokens[: n_windows * args.seq_len + 1], args.seq_len)
    torch.manual_seed(args.seed)  # every rank seeds alike, as it must for identical initial weights
    orders = {}
    for scheme in ("sampler + set_epoch", "sampler, no set_epoch", "shuffle=True, no sampler"):
        if scheme == "shuffle=True, no sampler":
            loader = DataLoader(data, batch_size=batch, shuffle=True)  # draws from the seeded global RNG
        else:  # each rank gets its own 1/world of a permutation seeded by seed + epoch
            sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
            loader = DataLoader(data, batch_size=batch, sampler=sampler)
        orders[scheme] = []
        for epoch in range(epochs):
            if scheme == "sampler + set_epoch":
                sampler.set_epoch(epoch)  # PyTorch's docs: call this at the start of every epoch
            orders[scheme].append([i for b in loader.batch_sampler for i in b])  # the indices it fetches
    everyone = [None] * world
    if world > 1:
        dist.all_gather_object(everyone, orders)
    else:
        everyone = [orders]
    if rank:
        return
    print(f"{len(data)} windows of {args.seq_len} tokens, {world} ranks, batches of {batch}")
    for scheme in orders:
        print(scheme)
        for epoch in range(epochs):
            for r in range(world):
                print(f"  epoch {epoch}, rank {r} reads {everyone[r][scheme][epoch]}")
    if args.out:
        save_atomic({s: [[everyone[r][s][e] for r in range(world)] for e in range(epochs)] for s in orders}, args.out)


# ---- what an all-reduce costs: measured, and the ring model fitted to it ----

def bench_all_reduce(sizes: list, repeats: int = 5, rounds: int = 10, warmup: int = 2,
                     budget_s: float | None = None) -> tuple:
    """(times, rounds): the seconds of every timed all-reduce (sum) of an fp32 tensor of each size in
    bytes: for each size, in the order given, rounds × repeats times in the order taken, each the slower
    rank's time; and the number of rounds made, at most `rounds`, as many as fit budget_s, at least 2.

    Every rank must call it with the same arguments; the ranks agree on the smallest plan (every
    collective needs every rank). The timing loop is measure.time_steps: the sizes
    take turns round by round, so a burst of load from elsewhere hits all of them alike. Within a
    round the largest size goes first, so every size follows a larger one that has pushed it out of
    the caches; smallest first, a size would find the caches warmed by a smaller one, and on a CPU
    the times of the middle sizes then depend on their neighbours."""
    from measure import time_steps
    order = sorted(set(sizes), reverse=True)
    tensors = {b: torch.zeros(b // 4) for b in order}  # zeros: sums stay zero, however many calls
    fns = {b: (lambda t=t: dist.all_reduce(t)) for b, t in tensors.items()}

    def agree(plan):  # (repeats, rounds): the smallest over the ranks
        t = torch.tensor(plan, dtype=torch.int64)
        if dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return tuple(t.tolist())
    stats = time_steps(fns, warmup=warmup, repeats=repeats, rounds=rounds, budget_s=budget_s, agree=agree,
                       min_rounds=2)
    times = torch.tensor([stats[b]["times_s"] for b in sizes], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a collective is done when its slowest rank is
    return times.tolist(), stats[order[0]]["rounds"]


def ring_bytes(size: float, world: int) -> float:
    """Bytes each rank sends in a ring all-reduce of `size` bytes: 2(G-1)/G · size over G ranks, the formula budget.py
    charges a DDP step with."""
    import budget
    return budget.ring_all_reduce_bytes(size, world)


def fit_ring(sizes: list, seconds: list, world: int) -> tuple:
    """(α in seconds, bandwidth in bytes/s) of t = α + ring_bytes(size) / bandwidth, by least squares
    on the relative residuals (t_model - t) / t.

    Relative, because the times span several decades and their noise grows with them: plain
    residuals would let the largest sizes decide alone and leave α, the small sizes' time, to chance."""
    t = torch.tensor(seconds, dtype=torch.float64)
    sent = torch.tensor([ring_bytes(b, world) for b in sizes], dtype=torch.float64)
    design = torch.stack([1 / t, sent / t], dim=1)  # each row divided by its t: relative residuals
    alpha, per_byte = torch.linalg.lstsq(design, torch.ones(len(t), 1, dtype=torch.float64)).solution.flatten()
    return alpha.item(), 1 / per_byte.item()


def ring_time(size: float, world: int, alpha: float, bandwidth: float) -> float:
    """Seconds the ring model predicts for an all-reduce of `size` bytes."""
    return alpha + ring_bytes(size, world) / bandwidth


def all_reduce_summary(sizes: list, times: list, world: int, rounds: int) -> dict:
    """bench_all_reduce's times, summarised per size: the fastest call, the median, the fastest of
    each half of the run (even and odd rounds: two runs taken in turns) and their ratio (≥ 1, the
    run-to-run noise); and the ring model fitted to the fastest calls, with the size at which its
    two terms are equal.

    The fastest call, not the median: on a CPU shared with other programs, a small all-reduce
    waits, often more than half the time, until the scheduler runs the other rank again; that wait
    belongs to the load, not to the link. The fastest of many calls is the one that did not wait."""
    import statistics

    from measure import round_halves
    halves = [round_halves(ts, rounds) for ts in times]
    fastest = [min(ts) for ts in times]
    alpha, bandwidth = fit_ring(sizes, fastest, world)
    return dict(sizes=list(sizes), fastest=fastest, medians=[statistics.median(ts) for ts in times],
                halves=halves, noise=[max(h) / min(h) for h in halves], alpha=alpha, bandwidth=bandwidth,
                crossover=alpha * bandwidth / ring_bytes(1.0, world))


def report_all_reduce(args, rank: int, world: int):
    """--bench-all-reduce: time; rank 0 prints the times and the fit, and saves the times with --out."""
    if world < 2 or args.rounds < 2 or len(args.sizes) < 2:
        fail("--bench-all-reduce needs at least 2 processes (torchrun), 2 --rounds and 2 --sizes")
    times, rounds = bench_all_reduce(args.sizes, args.repeats, args.rounds, budget_s=args.budget_s)
    if rank:
        return
    s = all_reduce_summary(args.sizes, times, world, rounds)
    print(f"all-reduce of fp32 (sum), gloo, {world} processes, {rounds} rounds × {len(times[0]) // rounds} calls "
          f"per size, the slower rank's time")
    print(f"  {'bytes':>11}  {'fastest':>12}  {'median':>12}  {'fastest of the even / odd rounds':>34}")
    for b, f, m, (even, odd) in zip(args.sizes, s["fastest"], s["medians"], s["halves"]):
        print(f"  {b:>11,}  {f * 1e3:9.3f} ms  {m * 1e3:9.3f} ms  {even * 1e3:13.3f} ms / {odd * 1e3:9.3f} ms")
    if s["alpha"] > 0 and s["bandwidth"] > 0:
        print(f"fit t = α + 2(G-1)/G · M / W to the fastest: α {s['alpha'] * 1e6:.0f} µs, bandwidth "
              f"{s['bandwidth'] / 1e9:.2f} GB/s, equal terms at {s['crossover'] / 1e3:,.0f} kB")
    else:  # noise larger than what the sizes tell apart
        print("fit t = α + 2(G-1)/G · M / W: no positive α and bandwidth fit these times; "
              "measure sizes further apart (kilobytes to tens of megabytes) or more rounds")
    if args.out:
        save_atomic({"world": world, "sizes": args.sizes, "rounds": rounds, "repeats": len(times[0]) // rounds,
                     "times_s": times}, args.out)


if __name__ == "__main__":
    main()
