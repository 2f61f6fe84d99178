"""Wrong on purpose: forgets the bf16 copies of the weights that autocast saves for backward."""
from exercises.solutions.ch12_memory_peak import peak_bytes as right
from shapes import mlp_hidden


def peak_bytes(shape) -> int:
    h, f = shape.d_model, mlp_hidden(shape.d_model)
    return right(shape) - (shape.n_layer * 2 * (4 * h * h + 3 * h * f) + 2 * shape.vocab_size * h)
