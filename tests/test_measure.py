import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from measure import (flops_per_token, matmul_peak, peak_memory, time_it, time_steps,
                     training_step_fn)
from model import GPT, GPTConfig

SMALL = dict(d_model=64, n_layer=2, n_head=2, seq_len=32)


def test_flops_per_token_of_default_model():
    cfg = GPTConfig()
    assert flops_per_token(cfg, GPT(cfg).num_params()) == 11_606_784


def test_formula_matches_pytorch_flop_counter():
    # with attention written as matmuls, the counter sees everything but the RMSNorm gains
    torch.manual_seed(0)
    cfg = GPTConfig(**SMALL)
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        model(x, x)[1].backward()
    per_token = fc.get_total_flops() // x.numel()
    norm_params = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    assert per_token == flops_per_token(cfg, model.num_params()) - 6 * norm_params


def test_time_it_and_time_steps_call_counts_and_order():
    calls = []
    stats = time_it(lambda: calls.append("f"), warmup=2, repeats=3)
    assert len(calls) == 5 and len(stats["warmup_s"]) == 2 and len(stats["times_s"]) == 3
    assert stats["min_s"] <= stats["median_s"]
    calls.clear()
    res = time_steps({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                     warmup=1, repeats=2, rounds=2)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 2  # warm-ups first, then interleaved rounds
    assert len(res["a"]["times_s"]) == 4 and len(res["b"]["warmup_s"]) == 1


def _trained_params(accum, autocast_dtype=None):
    torch.manual_seed(0)
    cfg = GPTConfig(**SMALL)
    model = GPT(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=gen)
    y = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=gen)
    loss = training_step_fn(model, opt, x, y, autocast_dtype=autocast_dtype, accum=accum)()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), loss


def test_training_step_accumulation_equals_big_batch():
    p1, _ = _trained_params(1)
    for k in (2, 4):
        pk, _ = _trained_params(k)
        assert (pk - p1).abs().max() < 1e-6
    torch.manual_seed(0)
    p_init = torch.cat([p.detach().flatten() for p in GPT(GPTConfig(**SMALL)).parameters()])
    assert (p1 - p_init).abs().max() > 1e-4  # the step really moved the parameters


def test_training_step_bf16_autocast_runs_and_keeps_fp32_weights():
    p, loss = _trained_params(1, autocast_dtype=torch.bfloat16)
    assert p.dtype == torch.float32 and torch.isfinite(loss)


def test_training_step_rejects_uneven_split():
    model = GPT(GPTConfig(**SMALL))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.zeros(6, 32, dtype=torch.long)
    with pytest.raises(ValueError, match="not divisible"):
        training_step_fn(model, opt, x, x, accum=4)


def test_peak_memory_measures_allocations():
    def fn():
        a = torch.ones(25_000_000)  # 100 MB, freed before b exists
        del a
        b = torch.ones(5_000_000)  # 20 MB
        c = torch.ones(1_000_000)  # 4 MB, alive together with b
        return b, c
    assert 100e6 <= peak_memory(fn) < 101e6

    def fn2():
        b = torch.ones(5_000_000)
        c = torch.ones(20_000_000)  # 20 MB + 80 MB alive at once
        return b.sum() + c.sum()
    assert 100e6 <= peak_memory(fn2) < 101e6


def test_matmul_peak_is_plausible():
    flops = matmul_peak(torch.float32, n=256, repeats=3)
    assert 1e8 < flops < 1e14


def test_profiler_buckets_follow_the_callers_and_shares_sum_to_one():
    from types import SimpleNamespace as Event

    from measure import BUCKET_NAMES, OTHER_BUCKET, bucket_of, bucket_shares, profile_step
    ce = Event(name="VocabCrossEntropyBackward", cpu_parent=None)
    assert bucket_of(Event(name="aten::fill_", cpu_parent=ce)) == "softmax/CE over vocab"  # from its caller
    assert bucket_of(Event(name="aten::mm", cpu_parent=ce)) == "matmul"  # its own name before its caller's
    assert bucket_of(Event(name="aten::mul", cpu_parent=None)) == OTHER_BUCKET
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL))
    x = torch.randint(0, model.cfg.vocab_size, (2, 32))
    shares = bucket_shares(profile_step(training_step_fn(model, torch.optim.AdamW(model.parameters()), x, x)))
    assert set(shares) <= set(BUCKET_NAMES) and {"matmul", "optimizer"} <= set(shares)
    assert sum(shares.values()) == pytest.approx(1.0)
