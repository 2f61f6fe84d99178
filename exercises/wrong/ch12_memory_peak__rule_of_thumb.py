"""Wrong on purpose: the rule of thumb, 16 bytes per parameter and 34·s·b·h per layer, nothing else."""
from shapes import param_count


def peak_bytes(shape) -> int:
    n = param_count(shape.d_model, shape.n_layer, shape.vocab_size)
    return 16 * n + 34 * shape.seq_len * shape.micro_batch * shape.d_model * shape.n_layer
