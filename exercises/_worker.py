"""The multi-process checks, run by checks.verdicts under torch.distributed.run (gloo):

    python -m torch.distributed.run --standalone --nproc-per-node=G exercises/_worker.py NAME OUT ANSWER.py...

Every process checks every answer in turn against the book's single-process computation, which each
process makes itself on the whole batch (the same threads and kernels, so fp32 results can be exact).
The processes agree on one sentence per answer (rank order: the first that found a difference); rank 0
writes the list to OUT as JSON.
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "code")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402

from exercises import checks  # noqa: E402
from script_support import accumulate_gradients, mean_across_ranks, process_group  # noqa: E402
from train import configure_optimizer  # noqa: E402

# ---- what the answers send: the collectives and point-to-point calls, counted ----

SENT = []  # (call, bytes, during backward)
IN_BACKWARD = [False]
ORIGINAL = {}


def _count(call):
    original = getattr(dist, call)
    ORIGINAL[call] = original

    def counted(tensor, *args, **kwargs):
        t = tensor[0] if isinstance(tensor, (list, tuple)) else tensor
        SENT.append((call, t.numel() * t.element_size(), IN_BACKWARD[0]))
        return original(tensor, *args, **kwargs)
    counted.__name__ = original.__name__
    setattr(dist, call, counted)
    if call in ("isend", "irecv"):  # P2POp(dist.isend, ...) checks its op against distributed_c10d's
        setattr(c10d, call, counted)


for _call in ("all_reduce", "send", "isend", "irecv", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
              "all_gather", "reduce_scatter"):
    _count(_call)


def backward(loss):
    IN_BACKWARD[0] = True
    try:
        loss.backward()
    finally:
        IN_BACKWARD[0] = False


def halves(x, y, rank, world):
    """This process's rows of the global batch, and the whole batch as the single process's micro-batches."""
    rows = x.size(0) // world
    micro = [(x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]) for r in range(world)]
    return micro[rank], micro


# ---- chapter 6: DDP by hand ----

def check_ch5_ddp(answer, rank, world, steps: int = 3):
    what = "one process's on the whole batch"
    # naive: one all-reduce per parameter after backward
    for variant in ("all_reduce_gradients", "BucketedDDP"):
        model, ref = checks.tiny_model(), checks.tiny_model()
        opt, ref_opt = configure_optimizer(model, 1e-3), configure_optimizer(ref, 1e-3)
        hooked = answer.BucketedDDP(model, bucket_bytes=BUCKET_BYTES) if variant == "BucketedDDP" else None
        for step, (x, y) in enumerate(checks.batches(steps, 4)):
            mine, micro = halves(x, y, rank, world)
            opt.zero_grad(set_to_none=True)
            ref_opt.zero_grad(set_to_none=True)
            SENT.clear()
            _, loss = model(*mine)
            backward(loss)
            if hooked is None:
                answer.all_reduce_gradients(model)
            else:
                hooked.finish()
            accumulate_gradients(ref, micro)
            diff = checks.grad_difference(model, ref, what, rel=1e-6)
            if diff:
                return f"{variant}, step {step}: {diff}"
            if hooked is not None:
                calls = [s for s in SENT if s[0] == "all_reduce"]
                n_params = len(list(model.parameters()))
                if not any(during for _, _, during in calls):
                    return (f"BucketedDDP, step {step}: no all-reduce started during backward; start each "
                            "bucket's from a gradient hook so it overlaps with the rest of backward")
                if len(calls) >= n_params or len(calls) < 2:
                    return (f"BucketedDDP, step {step}: {len(calls)} all-reduces for {n_params} parameters; with "
                            f"bucket_bytes={BUCKET_BYTES} the gradients go in buckets, more than one and fewer "
                            "than one per parameter")
            opt.step()
            ref_opt.step()
            diff = checks.param_difference(model, ref, f"one process's after step {step}", atol=1e-6)
            if diff:
                return f"{variant}: {diff}"
    return None


BUCKET_BYTES = 16 * 1024  # the tiny model's blocks: qkv 12 KiB, gate/up/down 8 KiB each; the embedding 1 MiB


# ---- chapter 7: a ring all-reduce ----

def check_ch6_ring_allreduce(answer, rank, world):
    from budget import ring_all_reduce_bytes
    for numel in (world * 512, world * 4096):
        t = torch.randn(numel, generator=torch.Generator().manual_seed(100 + rank))
        expected = t.clone()
        ORIGINAL["all_reduce"](expected)
        SENT.clear()
        mine = t.clone()
        out = answer.ring_all_reduce(mine)
        mine = mine if out is None else out
        d = (mine - expected).abs()
        if not d.max().item() <= 1e-5:
            i = int(d.argmax())
            return (f"rank {rank}, {numel} numbers: element {i} is {mine[i].item():.6g}, "
                    f"dist.all_reduce gives {expected[i].item():.6g}")
        sent = sum(b for call, b, _ in SENT if call in ("send", "isend"))
        message = numel * t.element_size()
        want = ring_all_reduce_bytes(message, world)
        others = sorted({call for call, _, _ in SENT if call not in ("send", "isend", "irecv")})
        if others:
            return f"rank {rank} called {', '.join(others)}; a ring all-reduce needs only send and recv"
        if sent != want:
            return (f"rank {rank} sent {sent:,} bytes with send/isend for a {message:,}-byte tensor; a ring "
                    f"all-reduce over {world} processes sends 2·(G−1)/G of it, {want:,.0f}")
    return None


# ---- chapter 7: ZeRO-1 ----

def optimizer_state_bytes(opt) -> int:
    """Bytes of the optimizer state (tensors of one or more dimensions; step counters are not counted) of
    every torch optimizer `opt` is or holds."""
    found = [opt] if isinstance(opt, torch.optim.Optimizer) else []
    for value in vars(opt).values():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, torch.optim.Optimizer) and v is not opt:
                found.append(v)
    return sum(t.numel() * t.element_size() for o in found for state in o.state.values()
               for t in state.values() if torch.is_tensor(t) and t.dim() >= 1)


def check_ch6_zero1(answer, rank, world, steps: int = 3):
    from memory import state_bytes
    model, ref = checks.tiny_model(), checks.tiny_model()
    kw = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    opt = answer.ShardedOptimizer(model.parameters(), torch.optim.AdamW, **kw)
    ref_opt = torch.optim.AdamW(ref.parameters(), **kw)
    for step, (x, y) in enumerate(checks.batches(steps, 4)):
        mine, micro = halves(x, y, rank, world)
        opt.zero_grad()
        ref_opt.zero_grad(set_to_none=True)
        _, loss = model(*mine)
        loss.backward()
        for p in model.parameters():
            mean_across_ranks(p.grad)  # DDP's gradients: the exercise is the optimizer
        opt.step()
        accumulate_gradients(ref, micro)
        ref_opt.step()
        diff = checks.param_difference(model, ref, f"one process's AdamW after step {step}", atol=1e-6)
        if diff:
            return diff
        n_params = model.num_params()
        book = state_bytes(n_params, gpus=world, scheme="zero1")["optimizer"]
        held = optimizer_state_bytes(opt)
        if held != book:
            return (f"after step {step} rank {rank} holds {held:,} bytes of optimizer state; the ledger's ZeRO-1 "
                    f"row (memory.state_bytes) holds {book:,.0f} for {n_params:,} parameters over {world} processes")
    return None


# ---- chapter 7: FSDP by hand ----

def check_ch6_fsdp(answer, rank, world, steps: int = 3):
    model, ref = checks.tiny_model(), checks.tiny_model()
    names = [name for name, _ in ref.named_parameters()]
    n_params = ref.num_params()
    allowed = n_params / world + world * len(names)  # 1/G of each parameter, padded to a multiple of G
    fsdp = answer.HandFSDP(model)
    shards = list(fsdp.shards())
    held = sum(s.numel() for s in shards)
    if held > allowed:
        return f"rank {rank} keeps {held:,} numbers of the {n_params:,} parameters; its shard is 1/{world} of them"
    # plain SGD: a gradient off by a factor moves the parameters by as much (Adam would hide the factor)
    opt, ref_opt = torch.optim.SGD(shards, lr=0.5), torch.optim.SGD(ref.parameters(), lr=0.5)
    for step, (x, y) in enumerate(checks.batches(steps, 4)):
        mine, micro = halves(x, y, rank, world)
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        SENT.clear()
        loss = fsdp.loss(*mine)
        backward(loss)
        fsdp.after_backward()
        calls = {call for call, _, _ in SENT}
        for needed in ("all_gather", "reduce_scatter"):
            if not any(c.startswith(needed) for c in calls):
                return (f"step {step}: rank {rank} made no {needed} call; FSDP all-gathers the weights and "
                        "reduce-scatters the gradients")
        whole = sum(p.numel() for p in model.parameters())
        if whole > allowed:
            return (f"step {step}: after after_backward() rank {rank}'s model still holds {whole:,} numbers of "
                    "whole weights; free them, FSDP keeps only the shards between uses")
        opt.step()
        accumulate_gradients(ref, micro)
        ref_opt.step()
        full = fsdp.full_state_dict()
        for name, q in zip(names, ref.parameters()):
            p = full.get(name)
            if p is None:
                return f"full_state_dict() has no {name}"
            if not torch.equal(p, q.detach()):
                d = (p - q.detach()).abs().max().item() if p.shape == q.shape else float("nan")
                return (f"after step {step}, parameter {name} differs from one process's by up to {d:.3g} "
                        "(fp32 FSDP is exact)")
    return None


CHECKS = {"ch6_ddp": check_ch5_ddp, "ch7_ring_allreduce": check_ch6_ring_allreduce,
          "ch7_zero1": check_ch6_zero1, "ch7_fsdp": check_ch6_fsdp}


def main():
    name, out, *paths = sys.argv[1:]
    results = []
    with process_group("gloo", timeout_s=60) as ranks:
        for path in paths:
            try:
                sentence = CHECKS[name](checks.load(path), ranks.rank, ranks.world)
            except NotImplementedError:
                sentence = checks.not_written(path)
            except Exception as e:
                sentence = checks.raised(e)
            agreed = [None] * ranks.world
            dist.all_gather_object(agreed, sentence)
            results.append(next((s for s in agreed if s), None))
    if ranks.rank == 0:
        Path(out).write_text(json.dumps(results, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
