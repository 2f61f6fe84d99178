"""Count what FSDP2 sends in one optimizer step of gradient accumulation, under its switches that
trade memory for communication (chapter 8).

    python -m torch.distributed.run --standalone --nproc-per-node 2 code/fsdp_comm.py --out comm.json

Every all-gather and reduce-scatter FSDP2 issues goes through torch.distributed.all_gather_single and
reduce_scatter_single; this script wraps both to count calls and the bytes of the whole (unsharded)
tensor, then runs one step of --accum micro-batches of chapter 6's and 5's small model (gloo, CPU) for each
setting. Rank 0 writes {setting: {"all_gather": [calls, bytes], "reduce_scatter": [calls, bytes]}}
and the parameters held by the root module and by the blocks, which FSDP2 treats differently:
reshard_after_forward=None (its default) means False for the root, True for every other module.
"""
import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import get_batch, load_tokens  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from script_support import (  # noqa: E402
    Parser,
    accumulate_gradients,
    fail,
    output_problem,
    positive_int,
    process_group,
    write_json,
)

SETTINGS = {  # name: (the blocks' reshard_after_forward, sync gradients on every micro-batch,
    #               reshard after every micro-batch's backward); otherwise only on the last
    "default": (True, True, True),
    "reshard_after_forward=False": (False, True, True),
    "no gradient sync until the last": (True, False, True),
    "all three": (False, False, False),
}


def count_collectives() -> dict:
    """Wrap FSDP2's two collectives; returns the live counts {name: [calls, bytes of the whole tensor]}."""
    counts = {"all_gather": [0, 0], "reduce_scatter": [0, 0]}
    all_gather, reduce_scatter = dist.all_gather_single, dist.reduce_scatter_single

    def gathered(output, input, *args, **kwargs):
        counts["all_gather"][0] += 1
        counts["all_gather"][1] += output.numel() * output.element_size()
        return all_gather(output, input, *args, **kwargs)

    def scattered(output, input, *args, **kwargs):
        counts["reduce_scatter"][0] += 1
        counts["reduce_scatter"][1] += input.numel() * input.element_size()
        return reduce_scatter(output, input, *args, **kwargs)

    dist.all_gather_single, dist.reduce_scatter_single = gathered, scattered
    return counts


@contextlib.contextmanager
def held(model, sync: bool, reshard: bool):
    """For a micro-batch before the last: whether its backward reduce-scatters the gradients (sync)
    and reshards the weights (reshard). The last micro-batch runs outside it, with both on."""
    model.set_requires_gradient_sync(sync)
    model.set_reshard_after_backward(reshard)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)


def one_step(reshard_after_forward: bool, sync_every: bool, reshard_every: bool, accum: int, counts: dict) -> dict:
    """Counts of one optimizer step of `accum` micro-batches, under one setting: the book's one
    accumulation loop, with the two switches in its no_sync context."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=64))
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward)
    fully_shard(model)  # the root: embeddings (tied with the output layer) and the final norm
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = get_batch(load_tokens().train, 2 * accum, 64, torch.Generator().manual_seed(dist.get_rank()))
    for name in counts:
        counts[name][:] = [0, 0]
    accumulate_gradients(model, list(zip(x.chunk(accum), y.chunk(accum))),
                         no_sync=lambda: held(model, sync_every, reshard_every))
    opt.step()
    return {name: list(c) for name, c in counts.items()}


def main(argv=None):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--accum", type=positive_int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    args = p.parse_args(argv)
    problem = output_problem(args.out)
    if problem:
        fail(f"--out: {problem}")
    with process_group("gloo") as ranks:
        if ranks.world < 2:
            fail("FSDP's collectives need two or more processes: start it with "
                 "python -m torch.distributed.run --standalone --nproc-per-node 2 code/fsdp_comm.py --out FILE")
        counts = count_collectives()
        result = {name: one_step(*setting, args.accum, counts) for name, setting in SETTINGS.items()}
        model = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=64))
        block_params = sum(p.numel() for p in model.blocks.parameters())
        if ranks.rank == 0:
            write_json(args.out, {"world": ranks.world, "accum": args.accum, "settings": result,
                                  "params": {"blocks": block_params, "root": model.num_params() - block_params}})


if __name__ == "__main__":
    main()
