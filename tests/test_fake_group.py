"""train_gpu.py as process r of a world it does not have: torch's `fake` process group, whose collectives
return at once and move nothing, lets one process build the mesh, the shards and a step of rank r of 4 or
64, with real tiny tensors. What it cannot see: what the other ranks send (the collectives' outputs are
not the sums a real group makes), so values after a collective mean nothing here; shapes, placements,
the local shards before any collective, and which code path runs, are the script's own.

The CUDA defaults that the CPU can run (C17): fp16 with the GradScaler and fused AdamW, whose step takes
the GradScaler's found_inf into the kernel (a path the CPU's default, foreach AdamW, never takes), on an
HSDP mesh; the sharded initialisation equal to the unsharded one over 4 and 64 ranks."""
import pytest
import torch
import torch.distributed as dist

import train_gpu
from fake_run import fake_group
from model import GPT, GPTConfig, init_per_parameter

SHAPE = ["--d-model", "32", "--n-layer", "2", "--n-head", "2", "--seq-len", "16", "--vocab-size", "250"]


class Tokens:
    train = torch.arange(1000) % 250


@pytest.mark.parametrize("shard,world,per_node", [("fsdp", 4, 4), ("hsdp", 4, 2), ("fsdp", 64, 8),
                                                  ("hsdp", 64, 8)])
def test_sharded_init_equals_slices_of_the_unsharded_one(shard, world, per_node):
    """Rank r's shards, made by the script's own shard() and model.init_per_parameter on its mesh, are
    rank r's rows of the plain model of the same seed (FSDP2's Shard(0): torch.chunk of dim 0, empty past
    the last chunk), for several r of 4 and of 64."""
    from torch.distributed.tensor import DTensor
    cfg = GPTConfig(vocab_size=250, d_model=32, n_layer=2, n_head=2, seq_len=16)
    plain = GPT(cfg)
    init_per_parameter(plain, 7)
    whole = dict(plain.named_parameters())
    args = train_gpu.build_parser().parse_args(["--device", "cpu", "--shard", shard, *SHAPE,
                                                "--micro-batch", "1", "--global-batch-tokens", str(16 * world)])
    shard_size = per_node if shard == "hsdp" else world
    for rank in sorted({0, 1, shard_size - 1, shard_size, world // 2 + 3, world - 1} & set(range(world))):
        with fake_group(rank, world, per_node):
            train_gpu.check_args(args, world)
            with torch.device("meta"):
                model = GPT(cfg)
            train_gpu.shard(model, args, torch.device("cpu"), "fp32")
            model.to_empty(device="cpu")
            init_per_parameter(model, 7)
            k = rank % shard_size  # this rank's place in its shard group
            for name, p in model.named_parameters():
                assert isinstance(p, DTensor) and p.device_mesh.ndim == (2 if shard == "hsdp" else 1), name
                chunks = torch.chunk(whole[name].detach(), shard_size, dim=0)
                expect = chunks[k] if k < len(chunks) else whole[name].detach()[:0]
                assert torch.equal(p.to_local(), expect), (shard, world, rank, name)


def test_fp16_gradscaler_and_fused_adamw_step_on_an_hsdp_mesh(monkeypatch):
    """The GPU's fp16 path on a 2×2 HSDP mesh of the fake group: train_gpu's setup (with the fused AdamW
    CUDA gets), train_step and optimizer_step run; the step goes through the fused kernel with the
    GradScaler's scale and found_inf (GradScaler.step's _step_supports_amp_scaling branch), and the
    found_inf flags are all-reduced over the processes (MAX) before it."""
    real_optimizer = train_gpu.configure_optimizer
    monkeypatch.setattr(train_gpu, "configure_optimizer", lambda *a, **k: real_optimizer(*a, **{**k, "fused": True}))
    fused_calls, reduced = [], []
    real_fused, real_all_reduce = torch._fused_adamw_, dist.all_reduce

    def fused(*a, **k):
        fused_calls.append(k)
        return real_fused(*a, **k)

    def all_reduce(tensor, *a, op=dist.ReduceOp.SUM, **k):
        reduced.append(op)
        return real_all_reduce(tensor, *a, op=op, **k)
    monkeypatch.setattr(torch, "_fused_adamw_", fused)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    args = train_gpu.build_parser().parse_args(["--device", "cpu", "--shard", "hsdp", "--precision", "fp16", *SHAPE,
                                                "--micro-batch", "2", "--global-batch-tokens", str(2 * 16 * 4 * 2)])
    with fake_group(0, 4, 2):
        accum = train_gpu.check_args(args, 4)
        t = train_gpu.setup(args, torch.device("cpu"), 0, 4, accum, "fp16", Tokens())
        assert t.scaler is not None and t.opt.defaults["fused"] and accum == 2
        p = next(t.raw.parameters())
        assert p.device_mesh.mesh_dim_names == ("replicate", "shard") and tuple(p.device_mesh.shape) == (2, 2)
        assert [type(x).__name__ for x in p.placements] == ["Replicate", "Shard"]
        assert t.model.blocks[0].attn.qkv.weight.dtype == torch.float32  # shards fp32; fp16 is the gather's
        train_gpu.train_step(t, 0)
        train_gpu.optimizer_step(t)
    assert dist.ReduceOp.MAX in reduced  # train_step's all-reduce of found_inf
    # the kernel itself skips a step whose found_inf is set, so it is called either way; no grad_scale:
    # train_step unscaled the gradients already (for clipping)
    assert fused_calls and all(k.get("found_inf") is not None and k.get("grad_scale") is None for k in fused_calls)
