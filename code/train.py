"""The training recipe: AdamW with weight decay on matrices only, linear warm-up then cosine decay
to a floor, gradient-norm clipping, and evaluation on fixed batches (mean loss, bits per byte).
The optimizer and the schedule live in optimizer.py, the loss of fixed batches in model.py, which
train_gpu.py (the script a reader copies) shares without this CPU loop; the chapters import them from here."""
import math
import time
from dataclasses import dataclass, field

import torch

from data import get_batch
from model import batch_losses
from optimizer import configure_optimizer, lr_at  # noqa: F401  (the chapters import them from here)
from script_support import set_lr


def evaluate(model, batches) -> float:
    """Mean loss over fixed batches, in eval mode."""
    losses = batch_losses(model, batches)
    return sum(losses) / len(losses)


def bits_per_byte(model, batches, byte_counts: torch.Tensor, losses=None) -> tuple[float, float]:
    """(mean loss in nats per token, bits per byte) over fixed batches.

    Bits per byte = total nats over all target tokens / ln 2 / UTF-8 bytes those targets decode to;
    unlike loss per token it does not depend on how the tokenizer cuts the text. byte_counts: the
    bytes each token id stands for (data.token_bytes). losses: each batch's mean loss if the model
    was just evaluated on these batches (e.g. History.val_batch_losses[-1]), so they are not run
    again; by default they are computed (batch_losses)."""
    if losses is None:
        losses = batch_losses(model, batches)
    nats = sum(loss * y.numel() for loss, (_, y) in zip(losses, batches, strict=True))
    n_tokens = sum(y.numel() for _, y in batches)
    n_bytes = sum(int(byte_counts[y].sum()) for _, y in batches)
    return nats / n_tokens, nats / math.log(2) / n_bytes


@dataclass
class TrainConfig:
    steps: int = 400
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 100
    seed: int = 0
    autocast: torch.dtype | None = None  # e.g. torch.bfloat16: mixed precision; weights stay fp32


@dataclass
class History:
    train_loss: list = field(default_factory=list)  # one per step
    val_steps: list = field(default_factory=list)
    val_loss: list = field(default_factory=list)
    val_batch_losses: list = field(default_factory=list)  # per evaluation: the loss of each val batch
    val_seconds: list = field(default_factory=list)  # per evaluation: seconds since training began
    seconds: float = 0.0


def train(model, train_tokens, cfg: TrainConfig, val_batches=None, log=None, on_eval=None) -> History:
    """Train `model` in place on random windows of `train_tokens`; evaluate every cfg.eval_every steps.

    After each evaluation, log (e.g. print) gets a line with the step and the losses, and
    on_eval(hist) is called with the history so far (e.g. to show progress in a long loop)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = configure_optimizer(model, cfg.lr, cfg.weight_decay, cfg.betas)
    hist = History()
    model.train()
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        set_lr(opt, lr_at(step, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr_ratio))
        x, y = get_batch(train_tokens, cfg.batch_size, cfg.seq_len, gen)
        with torch.autocast(x.device.type, dtype=cfg.autocast or torch.float32, enabled=cfg.autocast is not None):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        hist.train_loss.append(loss.item())
        done = step + 1
        if val_batches is not None and cfg.eval_every and done % cfg.eval_every == 0:
            hist.val_steps.append(done)
            losses = batch_losses(model, val_batches)
            hist.val_batch_losses.append(losses)
            hist.val_loss.append(sum(losses) / len(losses))
            hist.val_seconds.append(time.perf_counter() - t0)
            if on_eval:
                on_eval(hist)
            if log:
                log(f"step {done:4d}  train loss {hist.train_loss[-1]:.4f}  val loss {hist.val_loss[-1]:.4f}")
    hist.seconds = time.perf_counter() - t0
    return hist
