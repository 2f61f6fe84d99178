"""The model's shape arithmetic, without torch: MLP width, parameter count, FLOPs per token.

`model.py` builds the network from these numbers; the budget estimator and the memory ledger use them
for shapes far too large to build. Pure Python, so it also runs where torch does not exist.
"""


def mlp_hidden(d_model: int) -> int:
    """SwiGLU's hidden width: 8/3·d keeps its three matrices at the cost of a 4·d two-matrix MLP;
    rounded down to a multiple of 32."""
    return 32 * int(8 * d_model / 3 // 32)


def param_count(d_model: int, n_layer: int, vocab_size: int) -> int:
    """Parameters of the book's GPT: tied embedding V·d, per block two RMSNorm gains (2d), attention
    (qkv 3d² + projection d²) and SwiGLU (3·d·f), and the final RMSNorm (d). No biases."""
    h, f = d_model, mlp_hidden(d_model)
    return vocab_size * h + n_layer * (2 * h + 4 * h * h + 3 * h * f) + h


def matrix_param_count(d_model: int, n_layer: int, vocab_size: int) -> int:
    """The parameters that matmuls read (everything but the RMSNorm gains): under autocast each of
    them gets a bf16 copy during the step."""
    return param_count(d_model, n_layer, vocab_size) - (2 * n_layer + 1) * d_model


def flops_per_token(cfg, n_params: int) -> int:
    """Training FLOPs per token: 6N for the weights (forward 2N, backward 4N) plus attention's
    QKᵀ and PV, 12·L·T·d, which no parameter counts. `cfg` needs n_layer, seq_len and d_model."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.seq_len * cfg.d_model


def recompute_flops_per_token(cfg) -> int:
    """FLOPs per token that per-block activation checkpointing adds: each block's forward again, 2 per
    weight of the blocks (not the tied embedding/head, which is not recomputed) plus attention's forward
    4·L·T·d, a third of flops_per_token's 12·L·T·d. `cfg` needs d_model, n_layer, seq_len and vocab_size."""
    blocks = param_count(cfg.d_model, cfg.n_layer, cfg.vocab_size) - cfg.vocab_size * cfg.d_model - cfg.d_model
    return 2 * blocks + 4 * cfg.n_layer * cfg.seq_len * cfg.d_model
