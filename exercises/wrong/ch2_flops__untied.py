"""Wrong on purpose: the embedding and the output layer counted as two matrices (they are one, tied)."""
from shapes import param_count


def flops_per_token(cfg) -> int:
    n = param_count(cfg.d_model, cfg.n_layer, cfg.vocab_size) + cfg.vocab_size * cfg.d_model
    return 6 * n + 12 * cfg.n_layer * cfg.seq_len * cfg.d_model
