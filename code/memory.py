"""The memory ledger: the bytes one training step of the book's GPT holds on each device.

The memory formulas live in two files, each formula once: shapes.py holds what train_gpu.py prints
and the script a reader copies carries (the activations per layer and for the head, Run and the
run_* bytes held and sent), and this module, which imports those and adds the chapters' half. The
budget estimator and the chapters read all of it from here (memory.Run, memory.activation_bytes...).
Every figure names its precision layout and kernels, because the same model splits its bytes
differently under each.

  state        weights, gradients and optimizer state, in bytes per parameter for a precision
               layout, divided across devices as DDP or ZeRO-1/2/3 (FSDP) divide them;
  activations  what autograd saves for backward, per layer and for the head (shapes.py), derived term
               by term from this model's own operations; `trace_saved_bytes` counts the same thing
               from a real forward pass, and the tests hold the two equal to the byte;
  logits       the vocabulary-sized tensors of the loss, saved and temporary;
  checkpoint   per-block activation checkpointing keeps only each block's input and recomputes one
               block at a time during backward.

Pure Python except `trace_saved_bytes` (which imports torch when called).
"""
from shapes import (  # noqa: F401  (the run half of the ledger; chapters and budget.py read it as memory.X)
    CPU_LOSS_BLOCK,
    HALF,
    KERNELS,
    PRECISIONS,
    RING,
    RUN_SCHEMES,
    Run,
    Shape,
    activation_bytes,
    gathered_bytes,
    group_sizes,
    head_bytes,
    layer_bytes,
    logits_bytes,
    mlp_hidden,
    parameter_units,
    partial_reduce_bytes,
    peak_moment,
    run_activation_bytes,
    run_messages,
    run_peak_bytes,
    run_sent_bytes,
    run_state_bytes,
    unit_numels,
    weight_copy_bytes,
)

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
    model.recompute_blocks = checkpoint
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


def crosses_nodes(run: Run, collective: str) -> bool:
    """Whether a collective's group spans machines: HSDP's shard groups (consecutive ranks, never more
    than one machine: train_gpu.py refuses a larger --shard-size) stay inside one, its all-reduce across the
    groups (ranks shard_size apart) does not once the run spans machines; and so does every collective
    over all processes."""
    per_node = run.gpus_per_node or run.gpus
    if run.gpus <= per_node or group_sizes(run)[collective] <= 1:
        return False
    return not (run.scheme == "hsdp" and collective in ("all_gather", "reduce_scatter"))


def run_sent_by_link(run: Run) -> dict:
    """run_sent_bytes split by the link each collective's ring is limited by: {'node': bytes over the links
    inside a machine (NVLink), 'network': bytes of collectives whose group spans machines}. A ring that
    spans machines moves at the network's speed, whichever hops are inside one."""
    out = {"node": 0.0, "network": 0.0}
    for k, b in run_sent_bytes(run).items():
        out["network" if crosses_nodes(run, k) else "node"] += b
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
