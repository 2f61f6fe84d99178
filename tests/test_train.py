"""code/train.py: the learning-rate schedule, weight decay groups, the training loop, bits per byte."""
import math

import pytest
import torch

from model import GPT, GPTConfig
from train import TrainConfig, batch_losses, bits_per_byte, configure_optimizer, evaluate, lr_at, train

TINY = GPTConfig(vocab_size=64, d_model=16, n_layer=1, n_head=2, seq_len=16)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    lrs = [lr_at(s, 1.0, 10, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lr_at(100, 1.0, 10, 100) == pytest.approx(0.1)


def test_weight_decay_only_on_matrices():
    opt = configure_optimizer(GPT(TINY), 1e-3)
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0


def test_train_lowers_loss_and_is_reproducible():
    tokens = torch.arange(2000) % 64  # a perfectly predictable sequence
    batches = [(tokens[:16].view(1, 16), tokens[1:17].view(1, 16))]
    cfg = TrainConfig(steps=30, batch_size=4, seq_len=16, warmup=5, eval_every=10)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = GPT(TINY)
        before = evaluate(model, batches)
        hist = train(model, tokens, cfg, val_batches=batches)
        runs.append(hist)
    assert hist.val_steps == [10, 20, 30]
    assert hist.val_loss[-1] < before - 0.3
    assert runs[0].train_loss == runs[1].train_loss


def test_train_with_bf16_autocast_keeps_fp32_weights_and_learns():
    tokens = torch.arange(2000) % 64
    batches = [(tokens[:16].view(1, 16), tokens[1:17].view(1, 16))]
    cfg = TrainConfig(steps=30, batch_size=4, seq_len=16, warmup=5, eval_every=30, autocast=torch.bfloat16)
    torch.manual_seed(0)
    model = GPT(TINY)
    before = evaluate(model, batches)
    hist = train(model, tokens, cfg, val_batches=batches)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert hist.val_loss[-1] < before - 0.3


def test_bits_per_byte_is_total_nats_over_ln2_over_bytes():
    torch.manual_seed(0)
    model = GPT(TINY)
    x = torch.randint(64, (2, 16))
    y = torch.randint(64, (2, 16))
    counts = torch.randint(1, 4, (64,))
    loss, bpb = bits_per_byte(model, [(x, y)], counts)
    assert loss == pytest.approx(evaluate(model, [(x, y)]), rel=1e-5)
    assert bpb == pytest.approx(loss * y.numel() / math.log(2) / counts[y].sum().item(), rel=1e-6)


def test_bits_per_byte_reuses_losses_already_evaluated():
    torch.manual_seed(0)
    model = GPT(TINY)
    batches = [(torch.randint(64, (2, 16)), torch.randint(64, (2, 16))) for _ in range(3)]
    counts = torch.randint(1, 4, (64,))
    computed = bits_per_byte(model, batches, counts)
    given = bits_per_byte(model, batches, counts, losses=batch_losses(model, batches))
    assert given == pytest.approx(computed, rel=1e-12)
    # given losses are used as they are, not recomputed
    doubled = bits_per_byte(model, batches, counts, losses=[2 * x for x in batch_losses(model, batches)])
    assert doubled[1] == pytest.approx(2 * computed[1], rel=1e-12)


def test_on_eval_sees_each_evaluation_as_it_happens():
    tokens = torch.arange(2000) % 64
    batches = [(tokens[:16].view(1, 16), tokens[1:17].view(1, 16))]
    cfg = TrainConfig(steps=30, batch_size=4, seq_len=16, warmup=5, eval_every=10)
    seen = []
    torch.manual_seed(0)
    hist = train(GPT(TINY), tokens, cfg, val_batches=batches,
                 on_eval=lambda h: seen.append((h.val_steps[-1], len(h.train_loss), len(h.val_seconds))))
    assert seen == [(10, 10, 1), (20, 20, 2), (30, 30, 3)]
    assert all(0 < a <= b for a, b in zip(hist.val_seconds, hist.val_seconds[1:]))
    assert hist.val_seconds[-1] <= hist.seconds
