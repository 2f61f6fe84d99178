"""A second correct answer, written differently: the parameters counted on a model built on the meta
device (no memory), the forward pass's FLOPs tripled for training."""
import torch

from model import GPT


def flops_per_token(cfg) -> int:
    with torch.device("meta"):
        model = GPT(cfg)
    n_params = sum(p.numel() for p in model.parameters())  # the tied matrix is one parameter
    forward = 2 * n_params + cfg.n_layer * 2 * (2 * cfg.seq_len * cfg.d_model)  # QKᵀ and PV: 2·T·d each
    return 3 * forward  # backward: twice the forward
