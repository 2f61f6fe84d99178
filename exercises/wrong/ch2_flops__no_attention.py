"""Wrong on purpose: 6N only, without attention's QKᵀ and PV."""
from shapes import param_count


def flops_per_token(cfg) -> int:
    return 6 * param_count(cfg.d_model, cfg.n_layer, cfg.vocab_size)
