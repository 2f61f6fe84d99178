"""A small decoder-only GPT: pre-norm RMSNorm blocks, causal attention with RoPE, SwiGLU MLP,
no biases, tied input/output embeddings. Every chapter and script uses this one definition, with
its initialisation (whole, or one parameter at a time for a sharded model) and its loss on fixed
batches. What trains it, AdamW's groups and the learning-rate schedule, is in optimizer.py."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from shapes import mlp_hidden


@dataclass
class GPTConfig:
    vocab_size: int = 8192
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    seq_len: int = 128

    def __post_init__(self):
        if self.d_model % self.n_head != 0:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
        if (self.d_model // self.n_head) % 2 != 0:
            raise ValueError("RoPE needs an even head dimension (d_model / n_head)")

    @property
    def mlp_hidden(self) -> int:
        return mlp_hidden(self.d_model)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()  # (T, head_dim/2) each


def apply_rope(x, cos, sin):
    # x: (B, H, T, D); rotate each (first half, second half) pair by a position-dependent angle
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def cpu_kernels(x: torch.Tensor) -> bool:
    """Whether the model runs its CPU branches for x (the math attention kernel, the blocked loss) or the
    GPU's (the default attention kernel, the loss over the full logits): by x's device. One place, so that
    bookbuild/full_size.py can run the GPU's program on fake CPU tensors."""
    return x.device.type == "cpu"


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, kv: dict | None = None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
        causal = True
        if kv is not None:  # generation: this layer's keys and values of the tokens before these (KVCache)
            if "k" in kv:
                if T != 1:
                    raise ValueError("after the prompt, a KV cache takes one new token at a time")
                k, v = torch.cat([kv["k"], k], dim=2), torch.cat([kv["v"], v], dim=2)
                causal = False  # the one new token sees every token before it
            kv["k"], kv["v"] = k, v
        if cpu_kernels(x):
            # the CPU flash kernel's bf16 backward is slow, and written out as matmuls + softmax
            # torch.compile can fuse it: measured faster here in bf16 and under compile, no slower in fp32 eager
            with sdpa_kernel(SDPBackend.MATH):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin, kv: dict | None = None):
        x = x + self.attn(self.attn_norm(x), cos, sin, kv)
        return x + self.mlp(self.mlp_norm(x))


class KVCache:
    """For generation: each block's keys and values (batch, heads, tokens, head_dim) of every token so far,
    so that each new token's forward computes only its own q, k and v instead of the whole context again."""

    def __init__(self, n_layer: int):
        self.layers = [{} for _ in range(n_layer)]

    def __len__(self) -> int:
        return self.layers[0]["k"].size(2) if self.layers[0] else 0


VOCAB_BLOCK = 256  # rows per block: 256 × 8192 fp32 logits = 8 MiB; smaller blocks help compiled bf16 most


class _VocabCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits = h @ weightᵀ, computed a block of rows at a time.

    The plain way writes all N×V logits (2048 × 8192 floats = 64 MiB for one 16×128 batch), then
    reads and writes them again in log-softmax, its backward and the gather, so the step waits on
    memory, not arithmetic. Here each block's logits stay small enough to stay in cache: the loss
    and its gradient (softmax − one-hot) are made in place, and the gradient's two matmuls run
    right away. backward() only scales the stored gradients by the incoming one.
    """

    @staticmethod
    def forward(ctx, h, weight, targets, block):
        n = h.size(0)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for i in range(0, n, block):
            hb, tb = h[i:i + block], targets[i:i + block]
            logits = torch.mm(hb, weight.t()).float()
            target_logit = logits.gather(1, tb[:, None])
            top = logits.amax(dim=1, keepdim=True)
            probs = logits.sub_(top).exp_()  # softmax numerators, in place
            norm = probs.sum(dim=1, keepdim=True)
            total += (top + norm.log() - target_logit).sum()  # log-sum-exp minus the target's logit
            probs.div_(norm)
            probs[torch.arange(probs.size(0), device=probs.device), tb] -= 1
            probs = probs.to(h.dtype)
            grad_h[i:i + block] = torch.mm(probs, weight.to(h.dtype))
            grad_w += torch.mm(probs.t(), hb).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.n, ctx.weight_dtype = n, weight.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_out / ctx.n
        return grad_h * scale.to(grad_h.dtype), (grad_w * scale).to(ctx.weight_dtype), None, None


def vocab_cross_entropy(h, weight, targets, block: int | None = None):
    """Mean cross-entropy of the logits h @ weightᵀ against targets, without all the logits at once.

    h: (N, d), weight: (V, d), targets: (N,) token ids. Equal to
    F.cross_entropy(h @ weight.T, targets) up to float rounding. On a CPU, with gradients wanted,
    it runs _VocabCrossEntropy; without gradients (evaluation) it still goes a block at a time.
    On a GPU it is the plain form: torch.compile fuses it there and the logits fit in memory.
    """
    block = block or VOCAB_BLOCK
    if not cpu_kernels(h):
        return F.cross_entropy(torch.mm(h, weight.t().to(h.dtype)).float(), targets)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _VocabCrossEntropy.apply(h, weight, targets, block)
    total = sum(F.cross_entropy(torch.mm(h[i:i + block], weight.t().to(h.dtype)).float(),
                                targets[i:i + block], reduction="sum")
                for i in range(0, h.size(0), block))
    return total / h.size(0)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.final_norm = RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied: one matrix reads and writes tokens
        cos, sin = rope_tables(cfg.seq_len, cfg.d_model // cfg.n_head)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.recompute_blocks = False  # True: keep only each block's input, recompute it in backward
        self.apply(self._init_weights)
        # scale the residual projections down so the residual stream does not grow with depth
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * cfg.n_layer) ** 0.5)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() counts the tied matrix once

    def forward(self, idx, targets=None, cache: KVCache | None = None):
        T = idx.size(1)
        start = 0 if cache is None else len(cache)  # the position of idx's first token
        if start + T > self.cfg.seq_len:
            raise ValueError(f"sequence length {start + T} exceeds the model's seq_len {self.cfg.seq_len}")
        x = self.tok_emb(idx)
        if cache is not None:  # generation with a KV cache: the new tokens' positions, each block's cache
            cos, sin = self.rope_cos[start:], self.rope_sin[start:]
            for block, kv in zip(self.blocks, cache.layers):
                x = block(x, cos, sin, kv)
            return self.lm_head(self.final_norm(x)), None
        for block in self.blocks:
            if self.recompute_blocks and torch.is_grad_enabled():
                # recomputation (torch's activation checkpoint): the block's activations are dropped after
                # forward and made again, from its saved input, when backward reaches it
                x = checkpoint(block, x, self.rope_cos, self.rope_sin, use_reentrant=False)
            else:
                x = block(x, self.rope_cos, self.rope_sin)
        x = self.final_norm(x)
        if targets is None:
            return self.lm_head(x), None
        # training and evaluation need only the loss: skip the full logits (see vocab_cross_entropy)
        loss = vocab_cross_entropy(x.reshape(-1, x.size(-1)), self.lm_head.weight, targets.reshape(-1))
        return None, loss


# ---- one initialisation for a whole model and for a sharded one (train_gpu.py) ----

def init_std(name: str, cfg: GPTConfig) -> float | None:
    """The standard deviation GPT.__init__ draws the parameter `name` with; None: a norm weight (ones)."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith(("proj.weight", "down.weight")):
        return 0.02 / (2 * cfg.n_layer) ** 0.5  # the residual projections, as in GPT.__init__
    return 0.02


def parameter_seed(seed: int, name: str) -> int:
    """A seed for one parameter from the run's seed and the parameter's name (not Python's salted hash)."""
    import hashlib
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:7], "little")


def full_init(name: str, shape, cfg: GPTConfig, seed: int) -> torch.Tensor:
    """The whole initial value of one parameter, on the CPU in fp32: from its own generator, so it
    depends on the seed and the name only, never on which other parameters a process holds."""
    std = init_std(name, cfg)
    if std is None:
        return torch.ones(shape)
    return torch.empty(shape).normal_(0.0, std, generator=torch.Generator().manual_seed(parameter_seed(seed, name)))


@torch.no_grad()
def init_per_parameter(model: GPT, seed: int) -> None:
    """Initialise `model` (plain, or sharded by FSDP2, or just materialised from the meta device)
    with the same distributions as GPT.__init__, each parameter drawn whole from its own generator
    and then cut to the shard this process keeps. A plain and a sharded model of one seed start
    equal, and no process holds more than one whole parameter at a time beyond its shards."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    for name, p in model.named_parameters():  # the tied matrix once, under tok_emb.weight
        full = full_init(name, p.shape, model.cfg, seed)
        if isinstance(p, DTensor):  # keep this process's shard; src_data_rank=None: no communication
            full = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
            p.to_local().copy_(full)
        else:
            p.copy_(full)
    # buffers left empty by a model built on the meta device
    cos, sin = rope_tables(model.cfg.seq_len, model.cfg.d_model // model.cfg.n_head)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)


# ---- the loss on fixed batches (train.py's evaluation and train_gpu.py's) ----

@torch.no_grad()
def batch_losses(model, batches) -> list[float]:
    """The mean loss of each fixed batch, in eval mode: the spread between them shows how much an
    evaluation depends on which text it happens to use."""
    was_training = model.training
    model.eval()
    losses = [model(x, y)[1].item() for x, y in batches]
    model.train(was_training)
    return losses
