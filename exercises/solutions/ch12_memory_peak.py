"""The book's answer: chapter 12's ledger for one GPU, autocast, flash attention, full logits."""
from shapes import mlp_hidden, param_count


def peak_bytes(shape) -> int:
    t, h, a, s, v = shape.micro_batch * shape.seq_len, shape.d_model, shape.n_head, shape.seq_len, shape.vocab_size
    f = mlp_hidden(h)
    n = param_count(h, shape.n_layer, v)
    state = (4 + 4 + 8) * n  # fp32 weights, gradients, AdamW's two moments
    layer = 34 * t * h + 8 * t * f + 8 * t + 4 * t * a + 4 * s * (h // a) + 24
    head = 8 * t + 8 * t * h + 4 * t + 2 * t * h + 8 * t + 4  # ids, final norm, bf16 hidden, targets, weight
    logits = 4 * t * v  # saved fp32 log-probabilities
    temporaries = 8 * t * v  # two t×V fp32 gradients at the start of backward
    copies = shape.n_layer * 2 * (4 * h * h + 3 * h * f) + 2 * v * h  # autocast's bf16 weight copies
    return state + shape.n_layer * layer + head + logits + temporaries + copies
