"""What trains the GPT, shared by train.py, ddp_train.py and train_gpu.py: AdamW's parameter groups
(configure_optimizer, as nanoGPT's configure_optimizers) and the learning-rate schedule (lr_at)."""
import math

import torch


def configure_optimizer(model, lr: float, weight_decay: float = 0.1, betas=(0.9, 0.95), fused=None):
    """AdamW that decays matrices (embeddings, linear weights) but not norms' gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def lr_at(step: int, max_lr: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Learning rate for 0-based `step`: linear warm-up over `warmup` steps, then cosine to min_ratio·max_lr."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return max_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
