"""The model's shape arithmetic, and what a run of that shape holds and sends, without torch.

  the shape      MLP width, parameter count, FLOPs per token: `model.py` builds the network from these
                 numbers; the budget estimator and the memory ledger use them for shapes far too large
                 to build;
  activations    what autograd saves for backward per layer and for the head (Shape, activation_bytes),
                 derived term by term from this model's own operations (memory.trace_saved_bytes counts
                 the same from a real forward pass; the tests hold the two equal to the byte);
  a run          train_gpu.py's run on each of its processes (Run): the state it holds, the gathered
                 weights, the peak of the step (run_peak_bytes) and the bytes each collective
                 sends (run_messages, run_sent_bytes).

This is the memory ledger's half that train_gpu.py prints, so the script a reader copies carries it
without the chapters' half (memory.py: the textbook's layouts, step_bytes, the autograd trace), which
imports it from here. Pure Python, so it also runs where torch does not exist (the browser calculator).
"""
from dataclasses import dataclass


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


def run_sent_bytes(run: Run) -> dict:
    """Bytes each process sends per optimizer step, by collective, with ring collectives over each one's
    group of G processes (group_sizes): an all-gather or a reduce-scatter of a message of B bytes sends
    (G-1)/G·B, an all-reduce twice that."""
    sizes = group_sizes(run)
    return {k: RING[k] * (sizes[k] - 1) * b / sizes[k] if sizes[k] > 1 else 0
            for k, (_, b) in run_messages(run).items()}


def _n_layer(run: Run) -> int:
    return 1 if run.shape is None else run.shape.n_layer  # the size alone: one block-like unit


def prefetched_bytes(run: Run) -> int:
    """FSDP2, resharding after forward (zero3, hsdp): at the start of backward, while the loss's temporaries
    exist, its pre-backward hook has already all-gathered the last block for its backward: that all-gather's
    output, param_dtype, padded (torch's FSDPParamGroup.pre_backward, FSDPState._pre_backward prefetch)."""
    if not run.sharded or run.scheme not in ("zero3", "hsdp") or run.shape is None or run.shard_group == 1:
        return 0
    return run.param_bytes * unit_numels(run)["block"]["padded"]


def autocast_cache_bytes(run: Run) -> int:
    """DDP and one process with checkpointing: autocast caches the bf16 copy of every weight it casts until
    the autocast region ends (torch's autocast weight cache), so at the loss's forward every block's copies
    are held though checkpointing saves none for backward (activation_bytes counts the recomputed block's);
    with the fp32 logits that log_softmax reads this can outweigh the start of backward (1.5B, 48 blocks,
    on one GPU: 2.7 GiB of copies). Without checkpointing they are saved anyway ('weight copies'). 0 else."""
    if run.sharded or not run.checkpoint or run.shape is None or run.kernels != "gpu" or run.precision == "fp32":
        return 0
    return run.shape.n_layer * weight_copy_bytes(run.shape, run.kernels)["blocks"]


def grads_at_peak(run: Run) -> bool:
    """Whether the gradients run_state_bytes counts ('grads') exist when the activations peak at the start
    of the last micro-batch's backward: only as earlier micro-batches left them. None with one micro-batch
    (the step before set them to None); none under FSDP whose reduce-scatter waits for the last micro-batch
    (its whole gradients exist instead: 'whole grads'); DDP's and one process's, and FSDP's shards with
    sync_every, from the second micro-batch on."""
    return run.accum > 1 and (not run.sharded or run.sync_every)


def backward_block_bytes(run: Run) -> dict:
    """FSDP2 in the backward of one block, the largest such moment: {part: bytes}, 'total' their sum beyond
    the weights' and optimizer's shards. At block i (counting from the first): the gathered root and its
    param_dtype gradient (the tied head's, from the start of backward until the root's reduce-scatter at the
    end); block i gathered (zero3, hsdp; zero2 keeps every block) and its param_dtype gradients; block i-1's
    all-gather already issued (prefetch); block i+1's fp32 reduce-scatter input, which FSDP2 keeps until the
    next block's reduce-scatter (FSDPCommContext.reduce_scatter_states); the fp32 gradient shards of the
    blocks after i; and what the blocks up to i saved (with checkpointing their inputs and block i's
    recomputed activations). Where the weights are large against the activations (width 4096, one sequence
    of 4096 tokens, checkpointing) this is the step's peak, not the end of forward. FSDP only; {} else."""
    if not run.sharded or run.shape is None or run.shard_group == 1:
        return {}
    u, n_layer, pb = unit_numels(run), run.shape.n_layer, run.param_bytes
    act = run_activation_bytes(run)
    per_layer = act["layers"] // n_layer
    gathered_block = 0 if run.scheme == "zero2" else pb * u["block"]["whole"]
    best = {}
    for i in range(n_layer):
        parts = {"gathered weights": gathered_bytes(run) + gathered_block,
                 "prefetched block": (pb * u["block"]["padded"] if i > 0 and gathered_block else 0),
                 "unsharded grads": pb * (u["root"]["whole"] + u["block"]["whole"]),
                 "reduce-scatter input": 4 * u["block"]["padded"] if i < n_layer - 1 else 0,
                 "grads": 4 * (n_layer - 1 - i) * u["block"]["shard"],
                 "layers": (i + 1) * per_layer, "recomputed block": act["recomputed block"]}
        if sum(parts.values()) > sum(best.values()):
            best = parts
    return best


def run_peak_bytes(run: Run, n_params: int | None = None) -> dict:
    """Peak bytes per process by part, and their 'total', at the largest of three moments: the end of
    forward (the start of the last micro-batch's backward, the loss's temporaries alive), with
    checkpointing the recomputation of the last block, and under FSDP the backward of a block
    (backward_block_bytes). The parts: the state (run_state_bytes), the gathered weights (gathered_bytes),
    the block FSDP2 prefetches for backward (prefetched_bytes) and the activations (as step_bytes picks
    them). At the end of forward the gradients exist only as grads_at_peak says; at the recomputation
    they are counted (some exist). Without a shape: the state and the gathered weights alone. Held to
    torch's memory trackers on every printed plan at full size by bookbuild/full_size.py."""
    out = {k: v for k, v in run_state_bytes(run, n_params).items()}
    out["gathered weights"] = gathered_bytes(run)
    if partial_reduce_bytes(run):  # HSDP's sum of reduce-scatters awaiting the step's one all-reduce
        out["partial reduce"] = partial_reduce_bytes(run)
    if run.shape is None:
        out["total"] = sum(out.values())
        return out
    if prefetched_bytes(run):
        out["prefetched block"] = prefetched_bytes(run)
    act = peak_moment(run_activation_bytes(run), logits_bytes(run.shape, run.kernels)["temporary"], run.checkpoint)
    if act["logit temporaries"] and not grads_at_peak(run):  # the end of forward: no gradients yet
        out["grads"] = 0
    out.update(act)
    out["total"] = sum(out.values())
    cached = autocast_cache_bytes(run)
    if cached and act["logit temporaries"]:  # the loss's forward, still inside autocast, if larger
        fwd = {**act, "weight copies": act["weight copies"] + cached,
               "logit temporaries": logits_bytes(run.shape, run.kernels)["saved"]}
        if sum(fwd.values()) > sum(act.values()):
            out.update(fwd)
            out["total"] = sum(v for k, v in out.items() if k != "total")
    backward = backward_block_bytes(run)
    if backward:  # FSDP: the backward of a block, if larger; its parts replace those of the same names
        state = {k: out[k] for k in ("weights", "optimizer", "buckets", "whole grads", "partial reduce") if k in out}
        moment = {**state, **{k: 0 for k in act}, **backward}
        if sum(moment.values()) > out["total"]:
            out = {**moment, "total": sum(moment.values())}
    return out
