"""Count what FSDP2 sends in one optimizer step of gradient accumulation, under its switches that
trade memory for communication (chapter 5).

    python -m torch.distributed.run --standalone --nproc-per-node 2 code/fsdp_comm.py --out comm.json

Every all-gather and reduce-scatter FSDP2 issues goes through torch.distributed.all_gather_single and
reduce_scatter_single; this script wraps both to count calls and the bytes of the whole (unsharded)
tensor, then runs one step of --accum micro-batches of chapter 4's and 5's small model (gloo, CPU) for each
setting. Rank 0 writes {setting: {"all_gather": [calls, bytes], "reduce_scatter": [calls, bytes]}}
and the parameters held by the root module and by the blocks, which FSDP2 treats differently:
reshard_after_forward=None (its default) means False for the root, True for every other module.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import get_batch, load_tokens  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

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


def one_step(reshard_after_forward: bool, sync_every: bool, reshard_every: bool, accum: int, counts: dict) -> dict:
    """Counts of one optimizer step of `accum` micro-batches, under one setting."""
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
    for i, (xs, ys) in enumerate(zip(x.chunk(accum), y.chunk(accum))):
        last = i == accum - 1
        model.set_requires_gradient_sync(sync_every or last)
        model.set_reshard_after_backward(reshard_every or last)
        _, loss = model(xs, ys)
        (loss / accum).backward()
    opt.step()
    return {name: list(c) for name, c in counts.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    args = p.parse_args(argv)
    dist.init_process_group("gloo")
    counts = count_collectives()
    result = {name: one_step(*setting, args.accum, counts) for name, setting in SETTINGS.items()}
    model = GPT(GPTConfig(d_model=64, n_layer=2, n_head=2, seq_len=64))
    block_params = sum(p.numel() for p in model.blocks.parameters())
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({
            "world": dist.get_world_size(), "accum": args.accum, "settings": result,
            "params": {"blocks": block_params, "root": model.num_params() - block_params}}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
