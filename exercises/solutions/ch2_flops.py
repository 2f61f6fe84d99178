"""The book's answer: 6 FLOPs per parameter per token (forward 2, backward 4), plus attention's QKᵀ and PV."""
from shapes import mlp_hidden


def flops_per_token(cfg) -> int:
    d, f = cfg.d_model, mlp_hidden(cfg.d_model)
    per_block = 2 * d + 4 * d * d + 3 * d * f  # two RMSNorm gains, qkv + proj, SwiGLU's three matrices
    n = cfg.vocab_size * d + cfg.n_layer * per_block + d  # tied embedding once, final norm
    # QKᵀ and PV: 2·T·d multiply-adds each per token per layer forward (4·T·d FLOPs), three times that in training
    return 6 * n + 12 * cfg.n_layer * cfg.seq_len * d
