"""A second correct answer, written differently: grouped by what each byte scales with (per parameter,
per token, per token and vocabulary entry, fixed), with the parameters counted on a meta-device model."""
import torch

from model import GPT, GPTConfig
from shapes import mlp_hidden


def peak_bytes(shape) -> int:
    d, L, heads, T, V = shape.d_model, shape.n_layer, shape.n_head, shape.seq_len, shape.vocab_size
    ff = mlp_hidden(d)
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=V, d_model=d, n_layer=L, n_head=heads, seq_len=T))
    params = sum(p.numel() for p in model.parameters())
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # what autocast copies to bf16
    per_param = 4 + 4 + 4 + 4  # weight, gradient, exp_avg, exp_avg_sq (fp32)
    per_token = L * (34 * d + 8 * ff + 8 + 4 * heads) + (8 + 8 * d + 4 + 2 * d + 8)
    per_token_vocab = 4 + 8  # saved log-probabilities; then two fp32 gradients of them at once
    fixed = L * (4 * T * (d // heads) + 24) + 4
    tokens = shape.micro_batch * T
    return per_param * params + 2 * matrices + tokens * (per_token + V * per_token_vocab) + fixed
