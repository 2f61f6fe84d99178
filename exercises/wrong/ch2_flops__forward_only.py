"""Wrong on purpose: the forward pass only (2N and attention's forward), as if there were no backward."""
from shapes import param_count


def flops_per_token(cfg) -> int:
    return 2 * param_count(cfg.d_model, cfg.n_layer, cfg.vocab_size) + 4 * cfg.n_layer * cfg.seq_len * cfg.d_model
