"""The memory ledger: the bytes one training step of the book's GPT holds on each device.

This is the one place the memory formulas live; the budget estimator, the GPU script and the
chapters call it. Every figure names its precision layout and kernels, because the same model
splits its bytes differently under each.

  state        weights, gradients and optimizer state, in bytes per parameter for a precision
               layout, divided across devices as DDP or ZeRO-1/2/3 (FSDP) divide them;
  activations  what autograd saves for backward, per layer and for the head, derived term by term
               from this model's own operations; `trace_saved_bytes` counts the same thing from a
               real forward pass, and the tests hold the two equal to the byte;
  logits       the vocabulary-sized tensors of the loss, saved and temporary;
  checkpoint   per-block activation checkpointing keeps only each block's input and recomputes one
               block at a time during backward.

Pure Python except `trace_saved_bytes` (which imports torch when called).
"""
from dataclasses import dataclass

from shapes import mlp_hidden

# ---- state: bytes per parameter ------------------------------------------------------------------

# Each layout: bytes per parameter of the weights a forward pass reads, of their gradients, of an
# fp32 master copy (if the weights are not fp32 themselves) and of Adam's two fp32 moments.
LAYOUTS = {
    # train_gpu.py: fp32 weights updated by the optimizer, matmuls in bf16 under torch.autocast;
    # gradients land in the weights' dtype, fp32. No separate master copy: the weights are it.
    "autocast": dict(weights=4, grads=4, master=0, moments=8),
    # the ZeRO paper's mixed precision (its §3.1): bf16 weights and gradients, an fp32 master copy in the
    # optimizer, 16 bytes. Megatron-LM keeps its gradients in fp32 by default: fp32_grads below, 18 bytes.
    "mixed": dict(weights=2, grads=2, master=4, moments=8),
}
LAYOUT_NAMES = {"autocast": "autocast over fp32 weights (train_gpu.py)",
                "mixed": "bf16 weights and gradients + fp32 master (the ZeRO paper's 16 bytes)",
                "mixed, fp32 grads": "bf16 weights, fp32 gradients + fp32 master (Megatron-LM's default, 18 bytes)"}
SCHEMES = ("ddp", "zero1", "zero2", "zero3")
SCHEME_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3/FSDP", "hsdp": "HSDP"}


def layout_name(layout: str, fp32_grads: bool = False) -> str:
    """The layout as the estimator's report names it."""
    return LAYOUT_NAMES["mixed, fp32 grads" if layout == "mixed" and fp32_grads else layout]


def bytes_per_param(layout: str = "autocast", fp32_grads: bool = False) -> dict:
    """{'weights', 'grads', 'optimizer'} bytes per parameter (optimizer = master copy + moments).

    fp32_grads: keep (or accumulate) gradients in fp32 under the mixed layout, as Megatron does by
    default: 18 bytes instead of 16. The autocast layout's gradients are fp32 already."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    lay = LAYOUTS[layout]
    grads = 4 if fp32_grads else lay["grads"]
    return {"weights": lay["weights"], "grads": grads, "optimizer": lay["master"] + lay["moments"]}


def state_bytes(n_params: float, gpus: int = 1, scheme: str = "ddp", layout: str = "autocast",
                fp32_grads: bool = False) -> dict:
    """Weights, gradients and optimizer state on one device, in bytes.

    ZeRO (Rajbhandari et al., 2020) partitions the optimizer state across the data-parallel devices
    (stage 1), then also the gradients (stage 2), then also the weights (stage 3, which FSDP
    implements). Whatever a stage partitions, each device holds 1/gpus of it."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus}")
    per = bytes_per_param(layout, fp32_grads)
    stage = SCHEMES.index(scheme)  # 0 ddp, 1 zero1, 2 zero2, 3 zero3
    sharded = {"optimizer": stage >= 1, "grads": stage >= 2, "weights": stage >= 3}
    return {part: n_params * per[part] / (gpus if sharded[part] else 1)
            for part in ("weights", "grads", "optimizer")}


# ---- activations: what autograd saves ---------------------------------------------------------------

# The two ways the book's model runs a step (model.py picks by device):
KERNELS = {
    # train_gpu.py on a GPU, eager: bf16 autocast over fp32 weights, flash attention, the plain
    # cross-entropy over the whole vocabulary.
    "gpu": "bf16 autocast, flash attention, full logits",
    # the CPU chapters: fp32, the math attention kernel (it saves the s×s probabilities), and the
    # blocked cross-entropy that never holds all logits (model.vocab_cross_entropy).
    "cpu": "fp32, math attention, blocked cross-entropy",
}
CPU_LOSS_BLOCK = 256  # rows of logits the blocked cross-entropy holds at once (model.VOCAB_BLOCK)


@dataclass(frozen=True)
class Shape:
    """One training step's shape: the model and the micro-batch on one device."""
    d_model: int
    n_layer: int
    n_head: int
    seq_len: int
    micro_batch: int
    vocab_size: int = 8192

    def __post_init__(self):
        for name in ("d_model", "n_layer", "n_head", "seq_len", "micro_batch", "vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError(f"d_model {self.d_model} must split into {self.n_head} heads of even size (RoPE)")

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len


def layer_bytes(shape: Shape, kernels: str = "gpu") -> int:
    """Bytes autograd saves for one transformer block (t tokens, width h, MLP width f, a heads).

    gpu (bf16 autocast, flash attention); fp32 tensors are 4 bytes per number, bf16 2:
      two RMSNorms, each: its fp32 input, the normalised input and 1/rms  2·(4th + 4th + 4t)
      bf16 copies of the inputs that autocast makes for qkv, gate and up   2th + 2th + 2th
      the qkv output (flash keeps v, a view into it)                       6th
      q and k after RoPE, the attention output (flash)                     2th + 2th + 2th
      flash's log-sum-exp per head and token                               4ta
      RoPE's cos and sin cast to bf16, for q and for k                     4·s·(h/a)
      flash's random-number seed and offset (two uint64 tensors)           24
      SwiGLU: gate output, silu(gate), up output, their product            4 · 2tf
    = 34th + 8tf + 8t + 4ta + 4s(h/a) + 24. The attention output is saved once: flash returns it in
    (batch, seq, head) order, so the projection's input is a view of it.

    cpu (fp32, math attention):
      two RMSNorms as above                                                2·(8th + 4t)
      the normalised inputs of qkv and of gate/up                          4th + 4th
      math attention: scaled q, scaled k, a copy of v, the probabilities   3·4th + 4·b·a·s²
      the projection's input (a copy of the attention output)              4th
      SwiGLU                                                               4 · 4tf
    = 40th + 16tf + 8t + 4bas².
    """
    t, h, a, s = shape.tokens, shape.d_model, shape.n_head, shape.seq_len
    f = mlp_hidden(h)
    if kernels == "gpu":
        return 34 * t * h + 8 * t * f + 8 * t + 4 * t * a + 4 * s * (h // a) + 24
    if kernels == "cpu":
        return 40 * t * h + 16 * t * f + 8 * t + 4 * shape.micro_batch * a * s * s
    raise ValueError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)}")


def head_bytes(shape: Shape, kernels: str = "gpu") -> int:
    """Bytes saved outside the blocks, not counting the vocabulary-sized logits: the token ids (int64),
    the final RMSNorm (8th + 4t) and the loss's input. gpu: bf16 copy of the final hidden states
    (2th) and the int64 targets; cpu: the blocked loss keeps only its gradient w.r.t. the hidden
    states (4th), made during forward."""
    t, h = shape.tokens, shape.d_model
    if kernels == "gpu":
        return 8 * t + 8 * t * h + 4 * t + 2 * t * h + 8 * t + 4  # + the loss's scalar total weight
    if kernels == "cpu":
        return 8 * t + 8 * t * h + 4 * t + 4 * t * h
    raise ValueError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)}")


def logits_bytes(shape: Shape, kernels: str = "gpu") -> dict:
    """The vocabulary-sized tensors of the loss: {'saved', 'temporary'} bytes.

    gpu: cross_entropy saves its fp32 log-probabilities (4tV). At the start of backward two more
    t×V fp32 tensors exist at once, the gradient of the log-probabilities and of the logits (8tV).
    cpu: the blocked loss saves its gradient w.r.t. the (tied) output matrix, V×h fp32; while it
    runs it holds one block of fp32 logits and that block's V×h contribution to the gradient."""
    t, h, v = shape.tokens, shape.d_model, shape.vocab_size
    if kernels == "gpu":
        return {"saved": 4 * t * v, "temporary": 8 * t * v}
    if kernels == "cpu":
        return {"saved": 4 * v * h, "temporary": 4 * min(t, CPU_LOSS_BLOCK) * v + 4 * v * h}
    raise ValueError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)}")


def weight_copy_bytes(shape: Shape, kernels: str = "gpu") -> dict:
    """Under autocast every matmul saves the bf16 copy of its weight for backward: 2 bytes per matrix
    parameter, {'blocks': per block, 'output': the output matrix's, made from its transpose}."""
    if kernels != "gpu":
        return {"blocks": 0, "output": 0}
    h = shape.d_model
    return {"blocks": 2 * (4 * h * h + 3 * h * mlp_hidden(h)), "output": 2 * shape.vocab_size * h}


def activation_bytes(shape: Shape, kernels: str = "gpu", checkpoint: bool = False) -> dict:
    """What one micro-batch keeps for backward, by part, in bytes.

    checkpoint: per-block activation checkpointing. Each block keeps only its fp32 input (4th);
    during backward one block at a time is recomputed and holds its activations (and, under
    autocast, its weight copies) again: the 'recomputed block' part."""
    layer = layer_bytes(shape, kernels)
    copies = weight_copy_bytes(shape, kernels)
    n_layer, t, h = shape.n_layer, shape.tokens, shape.d_model
    out = {"layers": n_layer * (4 * t * h if checkpoint else layer),
           "recomputed block": layer + copies["blocks"] if checkpoint else 0,
           "head": head_bytes(shape, kernels),
           "logits": logits_bytes(shape, kernels)["saved"],
           "weight copies": copies["output"] + (0 if checkpoint else n_layer * copies["blocks"])}
    return out


def activation_coefficient(shape: Shape, kernels: str = "gpu") -> float:
    """Bytes per layer per (token · hidden unit): this model's answer to the 34 in 34·s·b·h."""
    return layer_bytes(shape, kernels) / (shape.tokens * shape.d_model)


def step_bytes(shape: Shape, n_params: float, gpus: int = 1, scheme: str = "ddp",
               layout: str = "autocast", fp32_grads: bool = False, checkpoint: bool = False,
               kernels: str = "gpu") -> dict:
    """Peak bytes of a training step on one device, by part, and their 'total'.

    The state (weights, gradients, optimizer) is there throughout. Activations peak at one of two
    moments: the end of forward, when everything saved and the loss's temporaries coexist; or,
    with checkpointing, while backward recomputes the last block (the head's tensors are freed by
    then). The parts are those of the larger moment; a part absent at that moment is 0.
    The activations are those of the autocast run (`kernels`); under the mixed layout the weights
    are bf16 already, so there are no weight copies.
    Left out: backward's short-lived gradients of activations, the CUDA context and the
    allocator's fragmentation (on a GPU, budget a few GB for these)."""
    out = state_bytes(n_params, gpus, scheme, layout, fp32_grads)
    act = activation_bytes(shape, kernels, checkpoint)
    if layout == "mixed":  # the weights are bf16 already: no autocast copies. The rest stays the
        act["weight copies"] = 0  # autocast run's, an upper bound (pure bf16 saves norm inputs in 2 bytes)
    out.update(peak_moment(act, logits_bytes(shape, kernels)["temporary"], checkpoint))
    out["total"] = sum(out.values())
    return out


def by_kind(peak: dict) -> dict:
    """A step's peak (step_bytes) in three kinds, in bytes: the model state (weights, gradients, optimizer),
    the logits with the loss's temporaries, and the activations (the rest)."""
    state = peak["weights"] + peak["grads"] + peak["optimizer"]
    logits = peak["logits"] + peak["logit temporaries"]
    return {"state": state, "activations": peak["total"] - state - logits, "logits": logits}


def peak_moment(act: dict, logit_temporaries: int, checkpoint: bool) -> dict:
    """The activations' parts at the larger of their two peaks: the end of forward (everything saved and
    the loss's temporaries) or, with checkpointing, backward recomputing the last block (the head's tensors
    and the logits freed by then); a part absent at that moment is 0. Both ledgers use it."""
    act = {**act, "logit temporaries": logit_temporaries}
    forward_end = {**act, "recomputed block": 0}
    recompute = {part: 0 for part in act}
    if checkpoint:
        recompute.update({"layers": act["layers"], "recomputed block": act["recomputed block"]})
    return max(forward_end, recompute, key=lambda parts: sum(parts.values()))


def measured_peak_prediction(shape: Shape, n_params: int, accum: int = 1, checkpoint: bool = False) -> int:
    """What measure.peak_memory should find for one optimizer step of the CPU path: the step's
    activation peak plus the fp32 gradients it creates, beyond the weights and the optimizer state
    that exist before the step. (With accum > 1 all gradients exist while the last micro-batch runs.)"""
    peak = step_bytes(shape, n_params, checkpoint=checkpoint, kernels="cpu")
    return peak["total"] - peak["weights"] - peak["optimizer"]


# ---- the rule of thumb, kept to show where it is wrong -----------------------------------------------

RULE_BYTES_PER_PARAM = 16  # the mixed layout's 2 + 2 + 12; the autocast layout's 4 + 4 + 8
RULE_ACTIVATION_COEFF = 34  # bytes per token per hidden unit per layer


def rule_of_thumb_activation_bytes(seq_len: int, micro_batch: int, d_model: int, n_layer: int) -> float:
    """34·s·b·h bytes per layer: Korthikanti et al. (2022), "Reducing Activation Recomputation in
    Large Transformer Models", eq. 1 without its 5·a·s/h attention-matrix term (which FlashAttention
    removes), for a GPT block with GELU, LayerNorm and dropout in 16-bit precision. Not this model:
    activation_bytes is."""
    return RULE_ACTIVATION_COEFF * seq_len * micro_batch * d_model * n_layer


# ---- witness: count what autograd really saves ---------------------------------------------------

def trace_saved_bytes(shape: Shape, kernels: str = "gpu", checkpoint: bool = False, param_dtype=None) -> dict:
    """Run one forward pass of the book's GPT and count the bytes autograd saves for backward.

    Every tensor saved for backward passes through torch.autograd.graph.saved_tensors_hooks; a
    storage is counted once however many views of it are saved, and the parameters' and buffers'
    own storages are left out (they are state, not activations).

    kernels="gpu" runs on the meta device (shapes only, no memory: a 7B shape takes seconds) with
    autocast's rule applied by hand, because torch.autocast does nothing to meta tensors: matmuls
    and attention cast their floating inputs to bf16, parameters once per step. Attention calls
    the flash kernel's own aten op, whose autograd formula saves what it saves on a GPU (q, k, v,
    output, log-sum-exp), with the output in the (batch, seq, head) order the CUDA kernel returns.
    kernels="cpu" runs the real CPU path (fp32, math attention, blocked loss) on real tensors:
    keep the shape small.

    Returns the parts of activation_bytes and their 'total', in bytes: 'layers' is what is saved
    between the embedding's output and the final norm, 'logits' any other saved tensor with a
    vocabulary-sized dimension, 'weight copies' the bf16 copies of parameters, 'head' the rest.
    With checkpoint=True, 'recomputed block' is what a one-block model saves (the recomputation
    runs the same operations), beyond the copies the checkpointed run already keeps.
    param_dtype: e.g. torch.bfloat16, the weights as FSDP's MixedPrecisionPolicy gathers them (no
    autocast then: every matmul already reads bf16; its saved weights are the gathered parameters)."""
    import torch

    from model import GPT, GPTConfig

    device = {"gpu": "meta", "cpu": "cpu"}[kernels]
    cfg = GPTConfig(vocab_size=shape.vocab_size, d_model=shape.d_model, n_layer=shape.n_layer,
                    n_head=shape.n_head, seq_len=shape.seq_len)
    with torch.device(device):
        model = GPT(cfg)
        idx = torch.zeros(shape.micro_batch, shape.seq_len, dtype=torch.long)
        targets = torch.zeros(shape.micro_batch, shape.seq_len, dtype=torch.long)
    if param_dtype is not None:  # the parameters only: FSDP casts no buffers (RoPE's tables stay fp32)
        for p in model.parameters():
            p.data = p.data.to(param_dtype)
    model.checkpoint_blocks = checkpoint
    state = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}

    # everything saved between the embedding's output and the final norm belongs to the blocks
    # (under checkpointing that is each block's input, which checkpoint() keeps for the recomputation)
    where = ["head"]
    model.tok_emb.register_forward_hook(lambda *_: where.__setitem__(0, "layers"))
    model.final_norm.register_forward_pre_hook(lambda *_: where.__setitem__(0, "head"))

    saved = {}
    copies = set()  # storages of bf16 copies of parameters (filled by AutocastByHand)

    def count(t):
        key = t.untyped_storage()._cdata
        if key not in state and key not in saved:
            part = "weight copies" if key in copies else where[0]
            if part == "head" and shape.vocab_size in t.shape:
                part = "logits"
            saved[key] = (part, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        if kernels == "gpu":
            with AutocastByHand(torch.bfloat16, flash=True, copies=copies):
                model(idx, targets)
        else:
            model(idx, targets)
    out = {"layers": 0, "recomputed block": 0, "head": 0, "logits": 0, "weight copies": 0}
    for part, nbytes in saved.values():
        out[part] += nbytes
    if checkpoint:  # backward recomputes one block at a time: what one block saves, copies included
        one = trace_saved_bytes(Shape(shape.d_model, 1, shape.n_head, shape.seq_len, shape.micro_batch,
                                      shape.vocab_size), kernels, param_dtype=param_dtype)
        out["recomputed block"] = one["layers"] + one["weight copies"] - out["weight copies"]
    out["total"] = sum(out.values())
    return out


def AutocastByHand(dtype, flash: bool = False, copies: set | None = None):
    """A context that applies torch.autocast's rule for this model's operations by hand, so that it
    works on tensors autocast ignores (the meta device): matmuls and attention cast floating
    inputs to `dtype`, and a parameter's cast is made once and reused (autocast's cache). Other
    operations run in their inputs' dtype, as under autocast (RMSNorm's inputs are fp32 either way).
    flash: run attention as the GPU's flash kernel. copies: a set that receives the storages of
    the parameters' casts."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    lower = {F.linear, torch.mm, torch.matmul, torch.bmm, F.scaled_dot_product_attention}

    class Mode(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.cache = {}

        def cast(self, x):
            if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype):
                return x
            if isinstance(x, torch.nn.Parameter):  # a leaf that requires grad: autocast caches it
                if id(x) not in self.cache:
                    self.cache[id(x)] = x.to(dtype)
                    if copies is not None:
                        copies.add(self.cache[id(x)].untyped_storage()._cdata)
                return self.cache[id(x)]
            y = x.to(dtype)
            if copies is not None and isinstance(x._base, torch.nn.Parameter):  # e.g. weight.t()
                copies.add(y.untyped_storage()._cdata)
            return y

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in lower:
                args = tuple(self.cast(a) for a in args)
                kwargs = {k: self.cast(v) for k, v in kwargs.items()}
                if flash and func is F.scaled_dot_product_attention:
                    return _flash_attention(*args, **kwargs)
            return func(*args, **kwargs)

    return Mode()


def _flash_attention(q, k, v, is_causal=False, **_):
    """Attention as the GPU's flash kernel does it, for counting: the output in the (batch, seq,
    head, dim) memory order the CUDA kernel returns, and saved for backward exactly what
    aten._scaled_dot_product_flash_attention's backward takes: q, k, v, the output, the
    log-sum-exp (fp32, one per head and token) and the random-number seed and offset."""
    import torch

    class FlashLike(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            b, a, s, d = q.shape
            out = q.new_empty(b, s, a, d).transpose(1, 2)
            lse = q.new_empty(b, a, s, dtype=torch.float32)
            seed = q.new_empty(2, dtype=torch.uint64)
            offset = q.new_empty((), dtype=torch.uint64)
            ctx.save_for_backward(q, k, v, out, lse, seed, offset)
            return out

    return FlashLike.apply(q, k, v)


# ---- one description of a run: what train_gpu.py does, held and sent ------------------------------

PRECISIONS = {
    # DDP (and one process) in train_gpu.py: fp32 weights, gradients and AdamW; matmuls in bf16 under
    # torch.autocast, which saves a bf16 copy of every weight for backward.
    "autocast": "bf16 autocast over fp32 weights",
    # FSDP2 in train_gpu.py: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), no autocast. The
    # shards, their gradients and AdamW stay fp32; the all-gathers move bf16, the reduce-scatters fp32;
    # forward and backward run on the gathered bf16 weights, so the residual stream is bf16 too.
    "bf16": "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)",
    # the same two on a GPU without bf16 (train_gpu.py --precision fp16, with a GradScaler): the bytes are
    # those of bf16, since fp16 is as wide.
    "autocast-fp16": "fp16 autocast over fp32 weights, GradScaler",
    "fp16": "FSDP2 MixedPrecisionPolicy(param_dtype=fp16, reduce_dtype=fp32), GradScaler",
    # a CPU run (train_gpu.py --precision fp32, the CPU default): everything fp32.
    "fp32": "fp32",
}
HALF = ("bf16", "fp16")  # FSDP's 16-bit param_dtype
# what train_gpu.py runs: --shard ddp, fsdp --no-reshard-after-forward, fsdp, hsdp
RUN_SCHEMES = ("ddp", "zero2", "zero3", "hsdp")
RING = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}  # messages a ring sends: ×(G-1)/G each


@dataclass(frozen=True)
class Run:
    """One training run as train_gpu.py performs it, on each of `gpus` devices.

    scheme       ddp; zero2 (FSDP2 per block and the root, the blocks' weights kept gathered from forward
                 to backward: --no-reshard-after-forward); zero3 (FSDP2, weights freed after forward and
                 gathered again for backward); hsdp (FSDP2 on a 2-D mesh: ZeRO-3 inside each group of
                 shard_size processes, replicated across the gpus / shard_size groups, whose gradient
                 shards one all-reduce per step sums)
    shard_size   hsdp: processes per shard group (train_gpu.py --shard-size; by default those of a node)
    gpus_per_node processes per machine: which collectives cross the network (run_sent_by_link); None:
                 all on one machine
    precision    a key of PRECISIONS: autocast (DDP), bf16 (FSDP's param_dtype), fp32
    accum        micro-batches per optimizer step
    sync_every   FSDP: reduce-scatter the gradients after every micro-batch (torchtitan's choice: the
                 gradients stay sharded) instead of holding the whole fp32 gradients until the last
                 micro-batch and reduce-scattering once (set_requires_gradient_sync(False)). DDP always
                 skips its all-reduce until the last micro-batch (no_sync): its gradients are whole anyway.
    checkpoint   per-block activation checkpointing
    bucket_view  DDP's gradient_as_bucket_view (train_gpu.py sets it): the gradients are views of the
                 buckets; without it DDP keeps its buckets, a second copy of the gradients
    root_reshard FSDP: the root module's reshard_after_forward. False: FSDP2's default for the root,
                 which train_gpu.py's shard() keeps, since backward needs the root's weights (the tied
                 head) first; True would gather the embedding again for backward
    kernels      gpu (flash attention, full logits) or cpu (math attention, blocked loss)
    """
    shape: Shape | None
    gpus: int = 1
    scheme: str = "ddp"
    precision: str = "autocast"
    accum: int = 1
    sync_every: bool = False
    checkpoint: bool = False
    bucket_view: bool = True
    root_reshard: bool = False
    kernels: str = "gpu"
    n_params: int | None = None  # without a shape (the size alone): the model as one unit, no activations
    shard_size: int | None = None
    gpus_per_node: int | None = None

    def __post_init__(self):
        if self.shape is None and self.n_params is None:
            raise ValueError("a run needs its shape or its n_params")
        if self.scheme not in RUN_SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}; choose one of {', '.join(RUN_SCHEMES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        if self.gpus < 1 or self.accum < 1:
            raise ValueError(f"gpus and accum must be at least 1, got {self.gpus} and {self.accum}")
        if self.scheme == "hsdp" and (not self.shard_size or self.gpus % self.shard_size):
            raise ValueError(f"hsdp needs a shard_size that divides gpus {self.gpus}, got {self.shard_size}")

    @property
    def shard_group(self) -> int:
        """Processes one parameter is sharded over: all of them (ZeRO-2/3), the shard group (HSDP), 1 (DDP)."""
        return self.shard_size if self.scheme == "hsdp" else self.gpus if self.sharded else 1

    @property
    def replicas(self) -> int:
        """Copies of each shard: the processes of DDP, the groups of HSDP, 1 under ZeRO-2/3."""
        return self.gpus // self.shard_group

    @property
    def sharded(self) -> bool:
        return self.scheme != "ddp" and self.gpus > 1

    @property
    def root_reshards(self) -> bool:
        return bool(self.root_reshard)

    @property
    def param_bytes(self) -> int:
        """Bytes per number of the weights forward and backward read."""
        return 2 if self.sharded and self.precision in HALF else 4

    def where(self) -> str:
        """How the model is spread: one process, DDP, or FSDP2 with its resharding."""
        if self.gpus == 1:
            return "1 process"
        if self.scheme == "ddp":
            return (f"DDP over {self.gpus} processes"
                    + (", gradients as bucket views" if self.bucket_view else ", buckets beside the gradients"))
        if self.scheme == "hsdp":
            return (f"HSDP over {self.gpus} processes: FSDP2 sharded over {self.shard_group} and replicated "
                    f"{self.replicas}×, ZeRO-3 inside a group" + (", root resharded" if self.root_reshards else
                                                                   ", root kept"))
        return (f"FSDP2 over {self.gpus} processes, "
                + ("ZeRO-3: weights freed after forward" if self.scheme == "zero3"
                   else "ZeRO-2: weights kept from forward to backward")
                + (", root resharded" if self.root_reshards else ", root kept"))

    def policy(self) -> str:
        """The precision policy, and what accumulation does with FSDP's gradients."""
        prec = self.precision
        if not self.sharded and prec in HALF:  # one process or DDP: the 16-bit dtype is autocast's
            prec = {"bf16": "autocast", "fp16": "autocast-fp16"}[prec]
        grads = ""
        if self.sharded and self.accum > 1:
            grads = ("; reduce-scatter every micro-batch" if self.sync_every
                     else "; whole fp32 gradients held until the last micro-batch")
        return PRECISIONS[prec] + grads

    def describe(self) -> str:
        return (f"{self.where()}; {self.policy()}; accumulation {self.accum}"
                f"{'; activation checkpointing' if self.checkpoint else ''}")


def parameter_units(d_model: int, n_layer: int, vocab_size: int) -> dict:
    """The parameters' shapes as FSDP2 groups them in train_gpu.py: one unit per block, then the root
    (the embedding, tied with the output layer, and the final norm). {'root': [...], 'block': [...]}, the
    block's list being that of each of the n_layer blocks. Their numbers add up to shapes.param_count."""
    h, f, v = d_model, mlp_hidden(d_model), vocab_size
    return {"root": [(v, h), (h,)],
            "block": [(h,), (3 * h, h), (h, h), (h,), (f, h), (f, h), (h, f)]}


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _padded_shard(shape: tuple, gpus: int) -> int:
    """Numbers of one padded shard: FSDP2 splits dim 0 into gpus chunks of ceil(dim0 / gpus) rows."""
    return -(-shape[0] // gpus) * _numel(shape[1:])


def unit_numels(run: Run) -> dict:
    """{'root', 'block'}: numbers in one unit, whole (unpadded) and as FSDP2 pads it for its collectives
    (shard group × the padded shard); the local shard rank 0 holds ('shard') and, padded, the gradient
    shard that HSDP's all-reduce sums ('padded shard')."""
    s, g = run.shape, max(1, run.shard_group)
    if s is None:  # the size alone: one unit treated as a block (resharded as blocks are), no padding
        return {"root": {"whole": 0, "padded": 0, "shard": 0, "padded shard": 0},
                "block": {"whole": run.n_params, "padded": run.n_params, "shard": run.n_params / g,
                          "padded shard": run.n_params / g}}
    out = {}
    for unit, shapes in parameter_units(s.d_model, s.n_layer, s.vocab_size).items():
        out[unit] = {"whole": sum(_numel(p) for p in shapes),
                     "padded": sum(g * _padded_shard(p, g) for p in shapes),
                     "shard": sum(min(_padded_shard(p, g), _numel(p)) for p in shapes),
                     "padded shard": sum(_padded_shard(p, g) for p in shapes)}
    return out


def _layer_bf16(shape: Shape) -> int:
    """One block's saved bytes when its weights are bf16 (FSDP's param_dtype, no autocast), the residual
    stream bf16: each RMSNorm computes in fp32 and saves fp32 tensors as under autocast (8th + 4t: its
    input made fp32 and the normalised input), its bf16 output is what qkv and gate/up read (2th + 2th:
    gate and up read one tensor, so it is saved once); qkv's output 6th; q and k after RoPE and flash's
    output 6th; the log-sum-exp 4ta; RoPE's fp32 tables cast to bf16 4s(h/a) (FSDP casts no buffers);
    flash's seed and offset 24; SwiGLU 8tf. = 32th + 8tf + 8t + 4ta + 4s(h/a) + 24: autocast's 34th less
    the one bf16 input copy that gate and up no longer make each. trace_saved_bytes(param_dtype=bf16)
    equals it to the byte (torch's rms_norm as it runs there, decomposed; a GPU's fused kernel may
    save less)."""
    t, h, a, s = shape.tokens, shape.d_model, shape.n_head, shape.seq_len
    return 32 * t * h + 8 * t * mlp_hidden(h) + 8 * t + 4 * t * a + 4 * s * (h // a) + 24


def run_activation_bytes(run: Run) -> dict:
    """What one micro-batch keeps for backward under this run, by part (as activation_bytes).

    DDP and one process: activation_bytes (autocast's bf16 weight copies included). FSDP with
    param_dtype bf16: the bf16 residual stream (_layer_bf16), and no weight copies: autograd saves the
    gathered bf16 weights themselves, which FSDP frees after forward (zero3) or keeps ('gathered
    weights' in run_held_bytes, counted there once)."""
    s = run.shape
    if not run.sharded or run.precision not in HALF or run.kernels != "gpu":
        act = activation_bytes(s, run.kernels, run.checkpoint)
        if run.sharded:  # fp32 FSDP: the saved weights are the gathered ones, not copies
            act["weight copies"] = 0
        return act
    t, h = s.tokens, s.d_model
    layer = _layer_bf16(s)
    return {"layers": s.n_layer * (2 * t * h if run.checkpoint else layer),  # checkpoint keeps the bf16 input
            "recomputed block": layer if run.checkpoint else 0,
            "head": head_bytes(s, "gpu"),  # as autocast's: the norm's output is bf16
            "logits": logits_bytes(s, "gpu")["saved"],
            "weight copies": 0}


def run_state_bytes(run: Run, n_params: int | None = None) -> dict:
    """Weights, gradients and optimizer state one process (rank 0) holds, in bytes, as its local tensors
    count them: {'weights', 'grads', 'optimizer', 'buckets', 'whole grads'}.

    DDP and one process: everything whole and fp32 (4 + 4 + 8 bytes per parameter), plus DDP's buckets
    (4 more) unless gradient_as_bucket_view. FSDP: rank 0's fp32 shards of weights, gradients and AdamW's
    moments; with accumulation and without sync_every, also the whole fp32 gradients (4 bytes per
    parameter, not divided) from the first micro-batch's backward to the last one's reduce-scatter."""
    u = unit_numels(run)
    n_layer = _n_layer(run)
    if n_params is None:
        n_params = u["root"]["whole"] + n_layer * u["block"]["whole"]
    if not run.sharded:
        return {"weights": 4 * n_params, "grads": 4 * n_params, "optimizer": 8 * n_params,
                "buckets": 0 if run.bucket_view or run.gpus == 1 else 4 * n_params, "whole grads": 0}
    shard = u["root"]["shard"] + n_layer * u["block"]["shard"]
    return {"weights": 4 * shard, "grads": 4 * shard, "optimizer": 8 * shard, "buckets": 0,
            "whole grads": 4 * n_params if run.accum > 1 and not run.sync_every else 0}


def partial_reduce_bytes(run: Run) -> int:
    """HSDP with sync_every and accumulation: FSDP2 reduce-scatters every micro-batch but all-reduces across
    the groups only on the last (set_requires_all_reduce(False) before it), summing the reduce-scatters'
    fp32 outputs, padded shards, in a buffer of their own until then (torch's foreach_reduce,
    partial_reduce_output)."""
    if run.scheme != "hsdp" or run.replicas == 1 or run.accum == 1 or not run.sync_every:
        return 0
    u = unit_numels(run)
    return 4 * (u["root"]["padded shard"] + _n_layer(run) * u["block"]["padded shard"])


def gathered_bytes(run: Run) -> int:
    """FSDP: bytes of gathered (unsharded) weights held at the end of forward, when the activations
    peak: every block's under zero2, and the root's unless it reshards. (During backward one or two
    blocks at a time are gathered again: transient, and smaller than zero2's whole model.)"""
    if not run.sharded:
        return 0
    u = unit_numels(run)
    held = (_n_layer(run) * u["block"]["whole"] if run.scheme == "zero2" else 0) + (
        0 if run.root_reshards else u["root"]["whole"])
    return run.param_bytes * held


def run_messages(run: Run) -> dict:
    """Bytes handed to each collective in one optimizer step, summed over its calls:
    {collective: [calls, bytes]}, the message of an all-gather being its output (the gathered units,
    padded) and of a reduce-scatter its input. The gradient norm's one-number all-reduce is not counted.

    DDP: one all-reduce of the fp32 gradients (its buckets) on the last micro-batch.
    FSDP, each micro-batch: forward gathers the root and every block; backward gathers again every
    unit resharded after forward (the blocks under zero3, the root if root_reshard). Reduce-scatters of
    every unit's gradients in reduce_dtype (fp32) on the last micro-batch, or on every one with
    sync_every. All-gathers travel in param_dtype (bf16 or fp32). HSDP: the same inside each shard group
    (as zero3), plus, once per step on the last micro-batch, one all-reduce per unit of its fp32 padded
    gradient shard across the groups."""
    out = {"all_gather": [0, 0], "reduce_scatter": [0, 0], "all_reduce": [0, 0]}
    if run.gpus == 1:
        return out
    if not run.sharded:
        n = run_state_bytes(run)["grads"]
        out["all_reduce"] = [1, n]  # one message: the sum of its buckets
        return out
    u = unit_numels(run)
    gathers = {"root": 1 + run.root_reshards, "block": 1 + (run.scheme in ("zero3", "hsdp"))}
    count = {"root": 1, "block": _n_layer(run)}
    for unit in ("root", "block"):
        calls = count[unit] * gathers[unit] * run.accum
        out["all_gather"][0] += calls
        out["all_gather"][1] += calls * u[unit]["padded"] * run.param_bytes
        scatters = count[unit] * (run.accum if run.sync_every else 1)
        out["reduce_scatter"][0] += scatters
        out["reduce_scatter"][1] += scatters * u[unit]["padded"] * 4
        if run.scheme == "hsdp" and run.replicas > 1:
            out["all_reduce"][0] += count[unit]
            out["all_reduce"][1] += count[unit] * u[unit]["padded shard"] * 4
    if run.shard_group == 1:  # HSDP with groups of one: nothing to gather or scatter
        out["all_gather"], out["reduce_scatter"] = [0, 0], [0, 0]
    return out


def group_sizes(run: Run) -> dict:
    """{collective: processes in its group}: the all-gathers and reduce-scatters run over the shard group
    (all processes under ZeRO-2/3), the all-reduce over the replicas (all processes under DDP)."""
    return {"all_gather": run.shard_group, "reduce_scatter": run.shard_group, "all_reduce": run.replicas}


def crosses_nodes(run: Run, collective: str) -> bool:
    """Whether a collective's group spans machines: HSDP's shard groups (consecutive ranks, never more
    than one machine: train_gpu.py refuses a larger --shard-size) stay inside one, its all-reduce across the
    groups (ranks shard_size apart) does not once the run spans machines; and so does every collective
    over all processes."""
    per_node = run.gpus_per_node or run.gpus
    if run.gpus <= per_node or group_sizes(run)[collective] <= 1:
        return False
    return not (run.scheme == "hsdp" and collective in ("all_gather", "reduce_scatter"))


def run_sent_bytes(run: Run) -> dict:
    """Bytes each process sends per optimizer step, by collective, with ring collectives over each one's
    group of G processes (group_sizes): an all-gather or a reduce-scatter of a message of B bytes sends
    (G-1)/G·B, an all-reduce twice that."""
    sizes = group_sizes(run)
    return {k: RING[k] * (sizes[k] - 1) * b / sizes[k] if sizes[k] > 1 else 0
            for k, (_, b) in run_messages(run).items()}


def run_sent_by_link(run: Run) -> dict:
    """run_sent_bytes split by the link each collective's ring is limited by: {'node': bytes over the links
    inside a machine (NVLink), 'network': bytes of collectives whose group spans machines}. A ring that
    spans machines moves at the network's speed, whichever hops are inside one."""
    out = {"node": 0.0, "network": 0.0}
    for k, b in run_sent_bytes(run).items():
        out["network" if crosses_nodes(run, k) else "node"] += b
    return out


def _n_layer(run: Run) -> int:
    return 1 if run.shape is None else run.shape.n_layer  # the size alone: one block-like unit


def run_peak_bytes(run: Run, n_params: int | None = None) -> dict:
    """Peak bytes per process by part, and their 'total': the state (run_state_bytes), the gathered
    weights (gathered_bytes) and the activations at their peak (as step_bytes picks it). Without a
    shape: the state and the gathered weights alone."""
    out = {k: v for k, v in run_state_bytes(run, n_params).items()}
    out["gathered weights"] = gathered_bytes(run)
    if partial_reduce_bytes(run):  # HSDP's sum of reduce-scatters awaiting the step's one all-reduce
        out["partial reduce"] = partial_reduce_bytes(run)
    if run.shape is None:
        out["total"] = sum(out.values())
        return out
    out.update(peak_moment(run_activation_bytes(run), logits_bytes(run.shape, run.kernels)["temporary"],
                           run.checkpoint))
    out["total"] = sum(out.values())
    return out


def textbook_sent_bytes(n_params: float, gpus: int, scheme: str, layout: str = "autocast",
                        fp32_grads: bool = False, grad_accum: int = 1) -> float:
    """The textbook's bytes per GPU per step (the ZeRO paper's accounting, ring collectives), for what
    train_gpu.py does not run: ZeRO-1, and the mixed layout. Weights and gradients travel in the
    layout's dtype. DDP: one all-reduce of the gradients. ZeRO-1: gradients reduce-scattered once, the
    updated weights all-gathered. ZeRO-2: a reduce-scatter after every micro-batch, the weights
    gathered once. ZeRO-3: the weights gathered for forward and for backward and the gradients
    reduce-scattered, every micro-batch: 1.5× DDP when weights and gradients have one dtype and
    grad_accum is 1. (train_gpu.py's FSDP: Run and run_sent_bytes.)"""
    if gpus == 1:
        return 0.0
    per = bytes_per_param(layout, fp32_grads)
    weights, grads = n_params * per["weights"], n_params * per["grads"]
    half = (gpus - 1) / gpus  # a reduce-scatter or an all-gather: (G-1)/G of a message
    sent = {"ddp": 2 * half * grads,
            "zero1": half * (grads + weights),
            "zero2": half * (grad_accum * grads + weights),
            "zero3": half * grad_accum * (2 * weights + grads)}
    return sent[scheme]
