"""Plan a training run before renting GPUs: compute, hours, cost and memory per GPU.

    python code/budget.py                                  # the rule of thumb's table, then the corrected one
    python code/budget.py --params 1e9 --gpus 8 --gpu H100 --d-model 2048 --n-layer 20
    python code/budget.py --model 124M --gpus 1 --gpu RTX3060 --micro-batch 8    # the seed's 12 GB question
    python code/budget.py --d-model 768 --n-layer 12 --vocab-size 50257 --gpus 1 --gpu RTX4090 \
        --seq-len 1024 --micro-batch 8 --tokens 3e9 --price-per-gpu-hour 0.6 --checkpoint-activations

What it assumes (each one a flag where a reader may differ):
  model       --model names a shape with its vocabulary and context (GPT-2's four sizes on GPT-2's 50,257
              tokens, the reference 1.3B and 7B, the book's own two models on its 8,192); a shape given
              with --d-model and --n-layer that is a named model's takes that model's vocabulary, any
              other shape the book's 8,192 (train_gpu.py's default), unless --vocab-size says otherwise;
  compute     FLOPs per token = 6N + 12·L·T·d (forward 2N, backward 4N, plus attention's QKᵀ and PV,
              which no parameter counts) when the shape is given; 6N when only --params is;
  data        D = 20·N tokens (Chinchilla's compute-optimal ratio) unless --tokens is given;
  time        hours = FLOPs / (GPUs · peak · MFU) / 3600, with the GPU's dense peak (bf16, or fp16 where
              it has no bf16) and MFU 40 %;
  memory      the memory ledger, code/memory.py: weights, gradients and optimizer state by precision
              layout (--layout; default: train_gpu.py's autocast over fp32 weights), split by DDP or
              ZeRO-1/2/3 (on one GPU they are DDP: one row); this model's activations (bf16 autocast,
              flash attention, eager autograd), the logits over --vocab-size and the loss's temporaries;
              --checkpoint-activations;
  fits        GB = 1e9 bytes; a run fits when the ledger's peak stays under 90 % of the GPU's memory
              (the rest: the CUDA context, the allocator's fragmentation, backward's short-lived buffers).
  batch       the global batch: GPT-3's for the nearest size (Brown et al. 2020, Table 2.1; 0.5M tokens
              up to 760M parameters, 1M at 1.3B, 2M at 6.7B) rounded to a multiple of 2^18 tokens, unless
              --global-batch-tokens or --grad-accum is given; the accumulation is the whole number of
              micro-batches nearest it, and every memory and communication row is computed with it;
  command     the train_gpu.py command of the first scheme that fits (ZeRO-1 has no flag: the closest,
              --shard fsdp --no-reshard-after-forward, is printed with what it costs), with this shape,
              vocabulary, micro-batch, global batch in tokens and --checkpoint-activations, under the
              torchrun flags launch/ uses (gpus.TORCHRUN_STOP_FLAGS: SIGUSR1 forwarded, 170 s to save)
              and with --out and --auto-resume (across machines HOST, RUN and OUT are yours: the first
              node's address, a job id, a folder every node sees); where nothing fits, the command of
              the largest micro-batch that fits, or with --checkpoint-activations, said in a note;
  params      with a shape, N is the shape's count (what train_gpu.py builds) in every row; a --params
              that differs is said in one line;
  step        one optimizer step = GPUs × micro-batch × seq-len × accumulation tokens; its compute time
              at this MFU, beside the time its communication takes over the GPU's link (code/gpus.py,
              per direction; across machines the slower of it and --node-link-gbit) with ring
              collectives and nothing overlapped, counted by memory.Run as train_gpu.py sends it: DDP one
              fp32 all-reduce per step; FSDP bf16 all-gathers every micro-batch (ZeRO-3 for forward and
              for backward) and fp32 reduce-scatters on the last micro-batch, or on every one with
              --grad-sync every (auto: only where holding the whole fp32 gradients does not fit);
              ZeRO-1 and --layout mixed as the textbook counts them (memory.textbook_sent_bytes).

With no arguments it prints the seed's rule of thumb (16 bytes/param, 34·s·b·h·L, 6N, no logits),
reproduced exactly, and beside it the same scenarios computed by the ledger.
"""
import argparse
import contextlib
import io
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory  # noqa: E402
from arguments import Parser, positive, positive_int  # noqa: E402
from gpus import CATALOG, DEFAULT_GPUS_PER_NODE, DEFAULT_NODE_LINK_GBIT, GPUS, TORCHRUN_STOP_FLAGS, link_bytes_per_s  # noqa: E402,E501
from shapes import flops_per_token, param_count, recompute_flops_per_token  # noqa: E402

USABLE_FRACTION = 0.9
GB = 1e9
DEFAULT_MFU = 0.40
DEFAULT_TOKENS_PER_PARAM = 20
GPT2_VOCAB = 50257  # GPT-2's tokenizer (Radford et al. 2019): every reference row of the corrected table
REFERENCE_VOCAB = GPT2_VOCAB
BOOK_VOCAB = 8192  # the book's tokenizer, and train_gpu.py's --vocab-size default
DEFAULT_SEQ_LEN = 2048


@dataclass(frozen=True)
class Scenario:
    label: str
    n_params: float  # the nominal size the rule of thumb uses
    d_model: int
    n_layer: int
    n_head: int
    seq_len: int
    micro_batch: int
    gpus: int

    def shape(self, vocab_size: int = REFERENCE_VOCAB) -> memory.Shape:
        return memory.Shape(self.d_model, self.n_layer, self.n_head, self.seq_len, self.micro_batch, vocab_size)


# The book's reference scenarios: nominal sizes, H100s, MFU 40 %, D = 20N.
REFERENCE = (
    Scenario("124M (GPT-2; h 768, L 12, s 1024, b 16)", 124e6, 768, 12, 12, 1024, 16, 1),
    Scenario("1.3B (h 2048, L 24, s 2048, b 8)", 1.3e9, 2048, 24, 16, 2048, 8, 8),
    Scenario("7B (h 4096, L 32, s 4096, b 2)", 7e9, 4096, 32, 32, 4096, 2, 64),
)
H100 = GPUS["h100"]


@dataclass(frozen=True)
class NamedModel:
    """A model --model can name: its shape, the vocabulary it was made with, its context (the default
    --seq-len) and where these come from."""
    d_model: int
    n_layer: int
    n_head: int
    seq_len: int
    vocab_size: int
    source: str
    micro_batch: int = 8  # --micro-batch's default for it: the reference scenario's where it has one


# GPT-2's four sizes (Radford et al. 2019, Table 2: layers and width; vocabulary 50,257, context 1,024;
# heads from the released configs), built as this book's model (SwiGLU, RMSNorm, RoPE, tied embedding),
# so "124M" counts 123.6M parameters; the reference table's 1.3B and 7B shapes; and the book's own two
# models on its own tokenizer (model.GPTConfig's default and train_gpu.py's; tests/test_budget.py checks both).
MODELS = {
    "124M": NamedModel(768, 12, 12, 1024, GPT2_VOCAB, "GPT-2 124M"),
    "350M": NamedModel(1024, 24, 16, 1024, GPT2_VOCAB, "GPT-2 350M"),
    "774M": NamedModel(1280, 36, 20, 1024, GPT2_VOCAB, "GPT-2 774M"),
    "1.5B": NamedModel(1600, 48, 25, 1024, GPT2_VOCAB, "GPT-2 1.5B"),
    **{sc.label.split()[0]: NamedModel(sc.d_model, sc.n_layer, sc.n_head, sc.seq_len, GPT2_VOCAB,
                                       f"the reference {sc.label.split()[0]}", sc.micro_batch)
       for sc in REFERENCE[1:]},
    "book-1.8M": NamedModel(128, 4, 4, 128, BOOK_VOCAB, "the book's default model"),
    "book-29M": NamedModel(512, 8, 8, 512, BOOK_VOCAB, "train_gpu.py's default model"),
}
VOCAB_NAMES = {GPT2_VOCAB: "GPT-2's tokenizer", BOOK_VOCAB: "the book's tokenizer"}


def named_model(d_model: int, n_layer: int) -> str | None:
    """The name of the model whose width and depth these are (None: no model --model names)."""
    return next((k for k, m in MODELS.items() if (m.d_model, m.n_layer) == (d_model, n_layer)), None)


def vocabulary(vocab_size: int | None, model: str | None, d_model: int | None, n_layer: int | None) -> tuple:
    """(vocabulary, why): --vocab-size when given; else the named model's (--model, or a shape that is a
    named model's: 768 × 12 is GPT-2 124M, so GPT-2's 50,257); else the book's 8,192, train_gpu.py's
    default. None without a shape: with the size alone there are no logits to count."""
    if vocab_size is not None:
        return vocab_size, "--vocab-size"
    name = model or (named_model(d_model, n_layer) if d_model is not None else None)
    if name is not None:
        m = MODELS[name]
        how = f"--model {name}" if model else f"d {m.d_model}, L {m.n_layer} is {m.source}'s shape"
        return m.vocab_size, f"{VOCAB_NAMES[m.vocab_size]}, as {m.source} has ({how}; --vocab-size changes it)"
    if d_model is None:
        return None, ""
    return BOOK_VOCAB, f"{VOCAB_NAMES[BOOK_VOCAB]}, train_gpu.py's default (--vocab-size changes it)"


# Tokens per optimizer step by model size: GPT-3's batch sizes (Brown et al. 2020, "Language Models are
# Few-Shot Learners", Table 2.1: 0.5M tokens from 125M to 760M parameters, 1M at 1.3B and 2.7B, 2M at
# 6.7B and 13B, 3.2M at 175B), each rounded to a multiple of 2^18 tokens: 0.5M is 524,288, the batch
# of nanoGPT's and nanochat's GPT-2 runs and train_gpu.py's default.
GPT3_BATCH = ((125e6, 0.5e6), (350e6, 0.5e6), (760e6, 0.5e6), (1.3e9, 1e6), (2.7e9, 1e6), (6.7e9, 2e6),
              (13e9, 2e6), (175e9, 3.2e6))
BATCH_QUANTUM = 2 ** 18
GPT3_BATCH_NAMES = {size: f"{batch / 1e6:g}M tokens" for size, batch in GPT3_BATCH}


def reference_batch_tokens(n_params: float) -> tuple:
    """(tokens per step, the GPT-3 size it comes from): the batch of the GPT-3 model nearest in size
    (by ratio), rounded to a multiple of 2^18 tokens."""
    size, batch = min(GPT3_BATCH, key=lambda row: (abs(math.log(n_params / row[0])), -row[0]))
    return max(1, round(batch / BATCH_QUANTUM)) * BATCH_QUANTUM, size


def accumulation(target_tokens: float, per_micro: int) -> int:
    """Micro-batches per GPU per step that come nearest the target global batch (at least one)."""
    return max(1, round(target_tokens / per_micro))


def train_hours(flops: float, gpus: int, peak_flops: float, mfu: float) -> float:
    return flops / (gpus * peak_flops * mfu) / 3600


def attention_share(shape: memory.Shape, n_params: float) -> float:
    """Attention's 12·L·T·d as a fraction of all training FLOPs per token."""
    return 1 - 6 * n_params / flops_per_token(shape, n_params)


def rule_of_thumb_rows(peak_flops: float = H100.peak_flops, mfu: float = DEFAULT_MFU) -> list:
    """The seed's table: 6ND, 16 bytes/param, 34·s·b·h·L, nominal sizes, no logits."""
    rows = []
    for sc in REFERENCE:
        tokens = DEFAULT_TOKENS_PER_PARAM * sc.n_params
        flops = 6 * sc.n_params * tokens
        state = {s: sum(memory.state_bytes(sc.n_params, sc.gpus, s, "mixed").values()) for s in ("ddp", "zero3")}
        rows.append(dict(
            scenario=sc, tokens=tokens, flops=flops, gpus=sc.gpus,
            hours=train_hours(flops, sc.gpus, peak_flops, mfu),
            state_ddp=state["ddp"], state_fsdp=state["zero3"],
            activations=memory.rule_of_thumb_activation_bytes(sc.seq_len, sc.micro_batch, sc.d_model, sc.n_layer)))
    return rows


def corrected_rows(peak_flops: float = H100.peak_flops, mfu: float = DEFAULT_MFU, layout: str = "autocast",
                   checkpoint: bool = False) -> list:
    """The same scenarios by the ledger: this model's parameters at each shape (vocabulary 50,257),
    FLOPs with attention, memory by part at the step's peak."""
    rows = []
    for sc in REFERENCE:
        shape = sc.shape()
        n = param_count(sc.d_model, sc.n_layer, REFERENCE_VOCAB)
        tokens = DEFAULT_TOKENS_PER_PARAM * n
        flops = flops_per_token(shape, n) * tokens
        peak = {s: peak_parts(shape, n, sc.gpus, s, layout, checkpoint=checkpoint) for s in ("ddp", "zero3")}
        rows.append(dict(scenario=sc, n_params=n, tokens=tokens, flops=flops, gpus=sc.gpus,
                         attention_share=attention_share(shape, n),
                         hours=train_hours(flops, sc.gpus, peak_flops, mfu),
                         parts_ddp=peak["ddp"], parts_fsdp=peak["zero3"],
                         state_ddp=_state(peak["ddp"]), state_fsdp=_state(peak["zero3"]),
                         activations=_activations(peak["ddp"]), logits=_logits(peak["ddp"]),
                         total_ddp=peak["ddp"]["total"], total_fsdp=peak["zero3"]["total"]))
    return rows


STATE_PARTS = ("weights", "grads", "optimizer", "buckets", "whole grads", "gathered weights", "prefetched block",
               "partial reduce", "unsharded grads", "reduce-scatter input")


def _state(parts: dict) -> float:
    """What a GPU holds of the model beyond one micro-batch's activations: its state (shards under FSDP),
    DDP's buckets, FSDP's whole gradients during accumulation and its gathered weights."""
    return sum(parts.get(k, 0) for k in STATE_PARTS)


def _logits(parts: dict) -> float:
    return parts["logits"] + parts["logit temporaries"]


def _activations(parts: dict) -> float:
    return sum(parts.get(k, 0) for k in ("layers", "recomputed block", "head", "weight copies"))


BACKWARD_SHARE = 4 / 6  # backward's share of a step's compute: 4N of the 6N FLOPs per token


def ring_all_reduce_bytes(nbytes: float, gpus: int) -> float:
    """Bytes each of `gpus` GPUs sends in a ring all-reduce of `nbytes`: a reduce-scatter, then an
    all-gather, each (G-1)/G of the message over G = gpus."""
    return 2 * (gpus - 1) / gpus * nbytes


FSDP_PRECISION = "bf16"  # train_gpu.py's FSDP policy: param_dtype bf16 (fp16 on a GPU without bf16), reduce fp32


def script_run(n_params: float, gpus: int, scheme: str, shape=None, grad_accum: int = 1, sync_every: bool = False,
               checkpoint: bool = False, gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> "memory.Run":
    """The run train_gpu.py performs for a scheme the ledger names (not ZeRO-1): DDP under autocast over
    fp32 weights, its gradients views of its buckets; FSDP2 with param_dtype bf16, reduce_dtype fp32; HSDP
    sharded over each machine's GPUs (train_gpu.py's default --shard-size)."""
    return memory.Run(shape, gpus=gpus, scheme=scheme, precision="autocast" if scheme == "ddp" else FSDP_PRECISION,
                      accum=grad_accum, sync_every=sync_every, checkpoint=checkpoint,
                      n_params=None if shape is not None else n_params,
                      shard_size=min(gpus, gpus_per_node) if scheme == "hsdp" else None, gpus_per_node=gpus_per_node)


def budget_schemes(gpus: int, gpus_per_node: int, layout: str = "autocast") -> tuple:
    """The rows the budget plans: the textbook's four, and HSDP as train_gpu.py runs it once the run spans
    machines whole (on one machine it is ZeRO-3; the textbook's layouts have no HSDP row). On one GPU,
    DDP's row alone: there is nothing to shard and no one to send to, so ZeRO-1/2/3 would repeat it
    (tests/test_budget.py checks that the ledger gives them the same numbers)."""
    if gpus == 1:
        return ("ddp",)
    spans = gpus > gpus_per_node and gpus % gpus_per_node == 0
    return (*memory.SCHEMES, "hsdp") if spans and layout == "autocast" else memory.SCHEMES


def is_script_scheme(scheme: str, layout: str) -> bool:
    """Whether train_gpu.py runs this scheme and layout (then memory.Run describes it), or only the
    textbook counts it (ZeRO-1; the mixed layout)."""
    return layout == "autocast" and scheme in memory.RUN_SCHEMES


def comm_bytes_per_step(*args, **kwargs) -> float:
    """Bytes each GPU sends in one optimizer step, over both links (comm_bytes_by_link's sum)."""
    return sum(comm_bytes_by_link(*args, **kwargs).values())


def sent_per_param(scheme: str, gpus: int, grad_accum: int = 1, textbook: bool = False,
                   sync_every: bool = False) -> float:
    """β: bytes one GPU sends per parameter in a step of grad_accum micro-batches; train_gpu.py's run, or
    the textbook's (weights and gradients in one dtype, every micro-batch synchronised)."""
    if textbook:
        return memory.textbook_sent_bytes(1, gpus, scheme, grad_accum=grad_accum)
    return comm_bytes_per_step(1, gpus, scheme, grad_accum=grad_accum, sync_every=sync_every)


def comm_threshold(beta: float, flops_s: float, link_bytes_s: float, c: float = 6) -> float:
    """T*: tokens per device per step at which communication takes as long as compute, β/c · (P·MFU)/W;
    c is the training FLOPs per token and parameter (6, or 6 plus attention's share)."""
    return beta * flops_s / (c * link_bytes_s)


def comm_bytes_by_link(n_params: float, gpus: int, scheme: str, layout: str = "autocast",
                       fp32_grads: bool = False, grad_accum: int = 1, shape=None, sync_every: bool = False,
                       gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> dict:
    """Bytes each GPU sends in one optimizer step, with ring collectives, by link: {'node': inside a
    machine, 'network': in collectives whose group spans machines}. For what train_gpu.py runs,
    memory.run_sent_by_link of its run (DDP: one fp32 all-reduce per step; FSDP: bf16 all-gathers every
    micro-batch, fp32 reduce-scatters on the last one, or every one with sync_every; HSDP: those inside
    each machine, and one all-reduce of the gradient shards between them); else the textbook's count,
    memory.textbook_sent_bytes, over all GPUs."""
    if is_script_scheme(scheme, layout):
        return memory.run_sent_by_link(script_run(n_params, gpus, scheme, shape, grad_accum, sync_every,
                                                  gpus_per_node=gpus_per_node))
    sent = memory.textbook_sent_bytes(n_params, gpus, scheme, layout, fp32_grads, grad_accum)
    return {"node": 0.0, "network": sent} if gpus > gpus_per_node else {"node": sent, "network": 0.0}


def peak_parts(shape, n_params: float, gpus: int, scheme: str, layout: str = "autocast", fp32_grads: bool = False,
               checkpoint: bool = False, grad_accum: int = 1, sync_every: bool = False,
               gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> dict:
    """The ledger's peak per GPU by part: memory.run_peak_bytes for what train_gpu.py runs, else the
    textbook's memory.step_bytes (no shape: the state alone)."""
    if is_script_scheme(scheme, layout):
        return memory.run_peak_bytes(script_run(n_params, gpus, scheme, shape, grad_accum, sync_every, checkpoint,
                                                gpus_per_node), n_params)
    if shape is None:
        parts = memory.state_bytes(n_params, gpus, scheme, layout, fp32_grads)
        return {**parts, "total": sum(parts.values())}
    return memory.step_bytes(shape, n_params, gpus, scheme, layout, fp32_grads, checkpoint)


def choose_sync(shape, n_params: float, gpus: int, scheme: str, memory_gb, layout: str = "autocast",
                checkpoint: bool = False, grad_accum: int = 1, grad_sync: str = "auto",
                gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> bool:
    """Whether FSDP reduce-scatters every micro-batch: --grad-sync every, or auto when holding the whole
    fp32 gradients until the last micro-batch does not fit (holding sends less)."""
    if scheme not in ("zero2", "zero3", "hsdp") or grad_accum == 1 or grad_sync == "last":
        return False
    if grad_sync == "every":
        return True
    if memory_gb is None:
        return False
    held = peak_parts(shape, n_params, gpus, scheme, layout, checkpoint=checkpoint, grad_accum=grad_accum,
                      gpus_per_node=gpus_per_node)
    return held["total"] > USABLE_FRACTION * memory_gb * GB


def max_micro_batch(shape: memory.Shape, n_params: float, gpus: int, scheme: str, memory_gb: float,
                    layout: str = "autocast", fp32_grads: bool = False, checkpoint: bool = False,
                    grad_accum: int = 1, sync_every: bool = False, gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> int:
    """The largest micro-batch whose ledger peak fits the usable memory (0: not even one sequence)."""
    limit = USABLE_FRACTION * memory_gb * GB

    def fits(b: int) -> bool:
        s = memory.Shape(shape.d_model, shape.n_layer, shape.n_head, shape.seq_len, b, shape.vocab_size)
        return peak_parts(s, n_params, gpus, scheme, layout, fp32_grads, checkpoint, grad_accum,
                          sync_every, gpus_per_node)["total"] <= limit

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):  # memory grows with the micro-batch: double, then bisect
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def sci(x: float, digits: int = 1) -> str:
    """1.845e18 -> '1.8e18' (the table's notation, without Python's '+' and leading zeros)."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def rule_of_thumb_table() -> str:
    lines = ["| model | tokens | FLOPs | GPUs | hours | state DDP | state FSDP | activations |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rule_of_thumb_rows():
        lines.append(
            f"| {r['scenario'].label} | {r['tokens'] / 1e9:.1f}B | {sci(r['flops'])} | {r['gpus']} | "
            f"{r['hours']:.1f} | {r['state_ddp'] / GB:.1f} GB | {r['state_fsdp'] / GB:.2f} GB | "
            f"{r['activations'] / GB:.1f} GB |")
    return "\n".join(lines)


def corrected_table() -> str:
    lines = ["| model | N | FLOPs | attention | hours | state DDP | state FSDP | activations | logits "
             "| peak DDP | peak FSDP |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in corrected_rows():
        lines.append(
            f"| {r['scenario'].label.split()[0]} | {r['n_params'] / 1e9:.3f}B | {sci(r['flops'])} | "
            f"{r['attention_share']:.1%} | {r['hours']:.1f} | {r['state_ddp'] / GB:.1f} GB | "
            f"{r['state_fsdp'] / GB:.2f} GB | {r['activations'] / GB:.1f} GB | {r['logits'] / GB:.1f} GB | "
            f"{r['total_ddp'] / GB:.1f} GB | {r['total_fsdp'] / GB:.1f} GB |")
    return "\n".join(lines)


def estimate(*, n_params: float, gpus: int, peak_flops: float, mfu: float, tokens: float,
             memory_gb: float | None = None, shape: memory.Shape | None = None, layout: str = "autocast",
             fp32_grads: bool = False, checkpoint: bool = False, price_per_gpu_hour: float | None = None,
             seq_len: int = 2048, micro_batch: int = 8, grad_accum: int = 1,
             link_bytes_s: float | None = None, grad_sync: str = "auto", node_bytes_s: float | None = None,
             gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> dict:
    """Everything the command line prints, as numbers (bytes, FLOPs, seconds, hours). Without a shape
    there is no activation memory and FLOPs are 6N per token; with one, its seq_len and micro_batch
    replace the arguments of those names. link_bytes_s: what one GPU sends per second in a ring over all
    the GPUs (None: unknown, no communication time); node_bytes_s: in a ring inside one machine (default:
    link_bytes_s). Recomputation (checkpoint) redoes each block's forward: those FLOPs take time at the
    same utilization, so the hours count them (the compute line counts the model's)."""
    per_token = 6 * n_params if shape is None else flops_per_token(shape, n_params)
    redone = 0 if shape is None or not checkpoint else recompute_flops_per_token(shape)
    node_bytes_s = link_bytes_s if node_bytes_s is None else node_bytes_s
    if shape is not None:
        seq_len, micro_batch = shape.seq_len, shape.micro_batch
    flops = per_token * tokens
    hours = train_hours((per_token + redone) * tokens, gpus, peak_flops, mfu)
    step_tokens = gpus * micro_batch * seq_len * grad_accum
    step = dict(tokens=step_tokens, seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum,
                steps=tokens / step_tokens, link_bytes_s=link_bytes_s, node_bytes_s=node_bytes_s,
                recompute_share=redone / per_token,
                compute_s=(per_token + redone) * step_tokens / (gpus * peak_flops * mfu))
    out = dict(n_params=n_params, tokens=tokens, flops=flops, gpus=gpus, hours=hours, gpu_hours=hours * gpus,
               attention_share=None if shape is None else attention_share(shape, n_params),
               cost=None if price_per_gpu_hour is None else hours * gpus * price_per_gpu_hour, step=step, memory={})
    for scheme in budget_schemes(gpus, gpus_per_node, layout):
        sync = choose_sync(shape, n_params, gpus, scheme, memory_gb, layout, checkpoint, grad_accum, grad_sync,
                           gpus_per_node)
        parts = peak_parts(shape, n_params, gpus, scheme, layout, fp32_grads, checkpoint, grad_accum, sync,
                           gpus_per_node)
        by_link = comm_bytes_by_link(n_params, gpus, scheme, layout, fp32_grads, grad_accum, shape, sync,
                                     gpus_per_node)
        sent = by_link["node"] + by_link["network"]
        # each link at its own speed: a ring inside a machine at its GPUs' link, one that spans machines at
        # the slower of that and the network port
        comm_s = None if link_bytes_s is None else by_link["node"] / node_bytes_s + by_link["network"] / link_bytes_s
        row = dict(state=_state(parts), activations=None, logits=None, total=None, fits=None,
                   max_micro_batch=None, comm_bytes=sent, comm_network_bytes=by_link["network"], comm_s=comm_s,
                   sync_every=sync,
                   script=is_script_scheme(scheme, layout),
                   comm_dominates=None if comm_s is None else comm_s > step["compute_s"])
        if shape is not None:
            row.update(parts=parts, activations=_activations(parts), logits=_logits(parts), total=parts["total"])
            if memory_gb is not None:
                row["fits"] = parts["total"] <= USABLE_FRACTION * memory_gb * GB
                row["max_micro_batch"] = max_micro_batch(shape, n_params, gpus, scheme, memory_gb, layout,
                                                         fp32_grads, checkpoint, grad_accum, sync, gpus_per_node)
        out["memory"][scheme] = row
    return out


def _cell(x, width: int) -> str:
    return f"{'?':>{width}}" if x is None else f"{x / GB:>{width}.2f}"


ONE_GPU_LINE = ("one GPU     nothing to shard and no gradients to all-reduce: DDP and ZeRO-1/2/3 hold the same "
                "and send nothing, so one row")


def memory_label(layout: str, fp32_grads: bool = False, gpus: int | None = None) -> str:
    """What the memory rows count: train_gpu.py's own precision per scheme (on one GPU, the plain model's),
    or a textbook layout."""
    if layout == "autocast" and gpus == 1:
        return f"as train_gpu.py runs it on one GPU: {memory.PRECISIONS['autocast']}"
    if layout == "autocast":
        return (f"as train_gpu.py runs: DDP {memory.PRECISIONS['autocast']} (gradients as bucket views), "
                f"FSDP {memory.PRECISIONS['bf16'].removeprefix('FSDP2 ')}; ZeRO-1 (not in train_gpu.py) as the "
                f"textbook counts it over fp32 weights under autocast")
    return memory.layout_name(layout, fp32_grads) + ", as the textbook counts it"


def report(est: dict, gpu_label: str, peak_flops: float, mfu: float, memory_gb, layout: str = "autocast",
           checkpoint: bool = False, link_label: str = "", fp32_grads: bool = False,
           peak_label: str = "bf16 dense peak") -> str:
    n, d = est["n_params"], est["tokens"]
    if est["attention_share"] is None:
        compute = f"compute     6·N·D = {sci(est['flops'], 2)} FLOPs (give --d-model and --n-layer to count attention)"
    else:
        compute = (f"compute     (6N + 12·L·T·d)·D = {sci(est['flops'], 2)} FLOPs "
                   f"(attention {est['attention_share']:.1%} of it)")
    named = MODELS.get(est.get("model") or "")
    lines = [
        f"model       {n / 1e9:.3f}B parameters"
        + (f" (--model {est['model']}: {named.source}, d {named.d_model}, L {named.n_layer}, {named.n_head} heads)"
           if named else "") + f", {d / 1e9:.1f}B tokens ({d / n:.1f} tokens/param)",
        compute,
        f"hardware    {est['gpus']} × {gpu_label}: {peak_flops / 1e12:.1f} TFLOP/s {peak_label} each, "
        f"MFU {mfu:.0%} → {est['gpus'] * peak_flops * mfu / 1e12:.0f} TFLOP/s achieved",
        f"time        {est['hours']:,.2f} hours ({est['hours'] / 24:,.2f} days), {est['gpu_hours']:,.1f} GPU-hours"
        + (f", recomputation included: each block's forward again, {est['step']['recompute_share']:.1%} more "
           "FLOPs at this utilization" if est["step"]["recompute_share"] else ""),
    ]
    if est.get("vocab_size") is not None and est["attention_share"] is not None:
        lines.insert(1, f"vocabulary  {est['vocab_size']:,}: {est['vocab_source']}")
    given = est.get("params_given")
    if given is not None and est["attention_share"] is not None and given != n:
        lines.insert(1, f"params      --params {given:,.0f} is not this shape's count; every figure here uses the "
                        f"shape's {n:,.0f}, the model train_gpu.py builds from it (code/shapes.py)")
    if est["cost"] is not None:
        lines.append(f"cost        {est['cost']:,.0f} (GPU-hours × price per GPU-hour)")
    lines.append(f"memory per GPU (GB): {memory_label(layout, fp32_grads, est['gpus'])}; activations of eager autograd "
                 f"with flash attention{', checkpointed per block' if checkpoint else ''}; logits include the "
                 f"loss's temporaries" + ("" if est["gpus"] == 1 else "; state includes DDP's buckets, FSDP's "
                                          "gathered weights and, with accumulation, its whole fp32 gradients"))
    limit = None if memory_gb is None else USABLE_FRACTION * memory_gb
    header = f"  {'scheme':<12} {'state':>8} {'activations':>12} {'logits':>8} {'total':>8}"
    if limit is not None:
        header += f"   fits {limit:.3g} of {memory_gb:g} GB?  max micro-batch"
    lines.append(header)
    for scheme, m in est["memory"].items():
        row = (f"  {memory.SCHEME_NAMES[scheme]:<12} {m['state'] / GB:>8.2f} {_cell(m['activations'], 12)} "
               f"{_cell(m['logits'], 8)} {_cell(m['total'], 8)}")
        if limit is not None:
            row += f"   {'?' if m['fits'] is None else ('yes' if m['fits'] else 'no'):<19}"
            row += f"  {'?' if m['max_micro_batch'] is None else m['max_micro_batch']}"
        lines.append(row)
    if est["gpus"] == 1:  # budget_schemes: one row
        lines.append(ONE_GPU_LINE)
    if est["step"]["grad_accum"] > 1 and est["gpus"] > 1:
        every = [memory.SCHEME_NAMES[s] for s in ("zero2", "zero3") if est["memory"][s]["sync_every"]]
        lines.append("accumulate  FSDP holds the whole fp32 gradients until the last micro-batch and reduce-scatters "
                     "once" + (f"; {', '.join(every)} reduce-scatter every micro-batch instead (--grad-sync)"
                               if every else ""))
    if est["attention_share"] is None:
        lines.append("  (activations need --d-model and --n-layer)")
    elif limit is not None:
        fitting = [s for s, m in est["memory"].items() if m["fits"]]
        if est["gpus"] == 1:
            lines.append("verdict     fits on one GPU" if fitting else "verdict     does not fit on one GPU: lower "
                         "--micro-batch, add --checkpoint-activations, or shard over more GPUs")
        elif fitting:
            missing = [memory.SCHEME_NAMES[s] for s in est["memory"] if s not in fitting]
            lines.append("verdict     fits under " + ", ".join(memory.SCHEME_NAMES[s] for s in fitting)
                         + (f" (not under {', '.join(missing)})" if missing else "")
                         + (" at this micro-batch" if missing else ""))
        else:
            lines.append("verdict     fits under no scheme: lower --micro-batch, add --checkpoint-activations, "
                         "or shard over more GPUs")
    lines += _step_lines(est, link_label)
    return "\n".join(lines)


def _size(n: float) -> str:
    return f"{n / 1e6:g}M" if n < 1e9 else f"{n / 1e9:g}B"


def _batch_line(st: dict, gpus: int) -> str:
    """Where the global batch comes from, and what the whole micro-batches make of it."""
    source, target, tokens = st["batch_source"], st["target_tokens"], st["tokens"]
    if source.startswith("--grad-accum"):
        return f"batch       {tokens:,} tokens per step ({source})"
    if tokens > target and st["grad_accum"] == 1 and tokens >= 1.5 * target:
        if st["micro_batch"] == 1:  # one sequence per GPU already: more GPUs only grow the batch
            return (f"batch       {tokens:,} tokens per step: one sequence on every GPU, more than the {target:,.0f} "
                    f"asked ({source}); data parallelism stops here: more GPUs add batch, not speed per step of "
                    "that batch; use fewer GPUs, or pipeline parallelism to share a sequence between GPUs (not in "
                    "train_gpu.py; chapter 8)")
        return (f"batch       {tokens:,} tokens per step: one micro-batch on every GPU, more than the {target:,.0f} "
                f"asked ({source}); lower --micro-batch or use fewer GPUs for a smaller batch")
    near = "" if tokens == target else f", the whole number of micro-batches nearest {target:,.0f}"
    return (f"batch       {tokens:,} tokens per step{near}: {source}; --global-batch-tokens or --grad-accum "
            f"changes it")


def _step_lines(est: dict, link_label: str) -> list:
    st = est["step"]
    lines = [] if "batch_source" not in st else [_batch_line(st, est["gpus"])]
    lines += [f"step        {est['gpus']} GPU{'s' if est['gpus'] > 1 else ''} × {st['grad_accum']} micro-batch"
             f"{'es' if st['grad_accum'] > 1 else ''} × {st['micro_batch']} sequences × {st['seq_len']} tokens = "
             f"{st['tokens']:,} tokens; {st['compute_s'] * 1e3:,.1f} ms of compute at this MFU; "
             f"{math.ceil(st['steps']):,} steps"]
    if est["gpus"] == 1:
        lines.append("comm        none: one GPU")
        return lines
    if st["link_bytes_s"] is None:
        lines.append("comm        link unknown: give --link-gb-s (GB/s one GPU sends to the others)")
        return lines
    split = st["node_bytes_s"] != st["link_bytes_s"]  # across machines: two links, each at its speed
    if split:
        lines.append(f"comm        ring collectives at {st['link_bytes_s'] / 1e9:g} GB/s per GPU where their group "
                     f"spans machines ({link_label}), {st['node_bytes_s'] / 1e9:g} GB/s inside one; not overlapped "
                     f"with compute")
    else:
        lines.append(f"comm        ring collectives at {st['link_bytes_s'] / 1e9:g} GB/s per GPU ({link_label}), "
                     f"not overlapped with compute")
    lines.append(f"  {'scheme':<12} {'sent/GPU GB':>12}" + (f" {'of it across':>13}" if split else "")
                 + f" {'comm ms':>10} {'comm/compute':>13}")
    for scheme, m in est["memory"].items():
        lines.append(f"  {memory.SCHEME_NAMES[scheme]:<12} {m['comm_bytes'] / GB:>12.2f}"
                     + (f" {m['comm_network_bytes'] / GB:>13.2f}" if split else "")
                     + f" {m['comm_s'] * 1e3:>10,.1f} {m['comm_s'] / st['compute_s']:>13.2f}")
    heavy = [memory.SCHEME_NAMES[s] for s, m in est["memory"].items() if m["comm_dominates"]]
    # backward is 4N of the 6N FLOPs per token: communication can hide behind it only below that share
    partly = [memory.SCHEME_NAMES[s] for s, m in est["memory"].items()
              if not m["comm_dominates"] and m["comm_s"] > BACKWARD_SHARE * st["compute_s"]]
    said = []
    if heavy:
        said.append("communication takes longer than compute under " + ", ".join(heavy)
                    + ": it cannot hide behind backward; raise --grad-accum or --micro-batch, or use a faster link")
    if partly:
        said.append("communication is shorter than compute but longer than backward (about 2/3 of compute) under "
                    + ", ".join(partly) + ": part of it shows in the step time")
    lines.append("verdict     " + ("; ".join(said) if said else "communication is shorter than backward (about 2/3 of "
                                   "compute) under every scheme: overlapped with backward it can hide"))
    return lines


# what train_gpu.py runs for each scheme the ledger counts; ZeRO-1 has no flag of its own
SHARD_FLAGS = {"ddp": ["--shard", "ddp"], "zero2": ["--shard", "fsdp", "--no-reshard-after-forward"],
               "zero3": ["--shard", "fsdp"],
               "hsdp": ["--shard", "hsdp"]}  # --shard-size: its default, the processes of a machine


def script_fits(est: dict) -> list:
    """The schemes train_gpu.py runs that fit, from the least sharded."""
    return [s for s in SHARD_FLAGS if s in est["memory"] and est["memory"][s]["fits"]]


def fastest_scheme(est: dict) -> str | None:
    """Of the schemes train_gpu.py runs that fit, the fastest: compute (the same for all) plus its
    communication at its links' speeds, not overlapped; without a link speed, the fewest bytes sent;
    ties to the least sharded."""
    runs, m = script_fits(est), est["memory"]
    if not runs:
        return None
    return min(runs, key=lambda s: (m[s]["comm_bytes"] if m[s]["comm_s"] is None else m[s]["comm_s"], runs.index(s)))


def command_lines(est: dict, shape, gpus_per_node: int, layout: str, checkpoint: bool) -> list:
    """The train_gpu.py command at this shape, micro-batch and step, under fastest_scheme. Across
    machines that is usually HSDP, whose only message between them is one all-reduce of the gradient
    shards."""
    if shape is None or not any(m["fits"] is not None for m in est["memory"].values()):
        return []
    if layout != "autocast":
        return ["command     none: train_gpu.py keeps fp32 weights under autocast; plan it with --layout autocast"]
    fitting = [s for s, m in est["memory"].items() if m["fits"]]
    if not fitting:
        return ["command     none: no scheme fits (see the verdict)"]
    lines = []
    if fitting[0] == "zero1" and "zero2" in fitting:
        extra = est["memory"]["zero2"]["comm_bytes"] - est["memory"]["zero1"]["comm_bytes"]
        lines.append("note        train_gpu.py has no ZeRO-1; the closest is --shard fsdp --no-reshard-after-forward "
                     f"(ZeRO-2): it holds less, and sends {extra / GB:.2f} GB more per GPU per step")
    runs = script_fits(est)
    if not runs:
        return [*lines, "command     none: only ZeRO-1 fits, which train_gpu.py does not run"]
    m = est["memory"]
    scheme = fastest_scheme(est)
    if scheme != runs[0] and m[scheme]["comm_s"] is not None:
        others = ", ".join(f"{memory.SCHEME_NAMES[s]} {m[s]['comm_s'] * 1e3:,.1f}" for s in runs if s != scheme)
        lines.append(f"note        {memory.SCHEME_NAMES[scheme]}: the fastest scheme that fits, "
                     f"{m[scheme]['comm_s'] * 1e3:,.1f} ms of communication per step ({others})")
    gpus, st = est["gpus"], est["step"]
    nodes = -(-gpus // gpus_per_node)
    if gpus % nodes:
        return [*lines, (f"command     none: {gpus} GPUs do not split evenly over {nodes} machines of "
                         f"{gpus_per_node}; choose --gpus as a multiple of --gpus-per-node")]
    launch = (["torchrun", "--standalone", f"--nproc-per-node={gpus}"] if nodes == 1 else
              ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpus // nodes}", "--rdzv-backend=c10d",
               "--rdzv-endpoint=HOST:29500", "--rdzv-id=RUN"])
    launch += TORCHRUN_STOP_FLAGS  # as launch/ runs it: a preemption notice ends in a checkpoint, not a kill
    flags = ["--d-model", shape.d_model, "--n-layer", shape.n_layer, "--n-head", shape.n_head, "--vocab-size",
             shape.vocab_size, "--seq-len", shape.seq_len, "--micro-batch", shape.micro_batch,
             "--global-batch-tokens", st["tokens"], "--steps", math.ceil(st["steps"]), *SHARD_FLAGS[scheme]]
    if checkpoint:
        flags.append("--checkpoint-activations")
    if scheme != "ddp" and st["grad_accum"] > 1:  # the choice the rows were computed with, said explicitly
        flags += ["--grad-sync", "every" if est["memory"][scheme]["sync_every"] else "last"]
    if needs_own_data(est):
        flags += ["--data", "DATA"]
    # a requeued or restarted job continues from its newest checkpoint; across machines OUT must be a
    # folder every node sees (each writes its own shards there)
    flags += ["--out", "out_gpu" if nodes == 1 else "OUT", "--auto-resume"]
    return lines + [command_verdict(est, scheme),
                    "command     " + " ".join(str(x) for x in [*launch, "code/train_gpu.py", *flags])]


# train_gpu.py's default data: the book's 全宋词 tokens (code/data.py), their training split;
# tests/test_budget.py holds this equal to data.load_tokens()
BOOK_TRAIN_TOKENS = 1_551_939


def needs_own_data(est: dict) -> bool:
    """Whether the plan needs a corpus of the reader's own: it reads more than the book's tokens once,
    or its vocabulary is not the book's tokenizer's."""
    return est["tokens"] > BOOK_TRAIN_TOKENS or est.get("vocab_size", BOOK_VOCAB) != BOOK_VOCAB


def data_line(est: dict) -> str:
    d = est["tokens"]
    passes = d / BOOK_TRAIN_TOKENS
    why = []
    if d > BOOK_TRAIN_TOKENS:
        why.append(f"it reads {d:,.0f} tokens, {passes:,.0f} passes over the book's {BOOK_TRAIN_TOKENS:,} "
                   "training tokens (train_gpu.py's default data)")
    if est.get("vocab_size", BOOK_VOCAB) != BOOK_VOCAB:
        why.append(f"its vocabulary is {est['vocab_size']:,}, not the book tokenizer's {BOOK_VOCAB:,}")
    if not why:
        return (f"data        {d:,.0f} tokens, {passes:.2f} of a pass over the book's {BOOK_TRAIN_TOKENS:,} "
                "training tokens (train_gpu.py's default data)")
    return ("data        the command names --data DATA: " + "; ".join(why) + ". DATA is a uint16 token file "
            f"of your own with at least {d:,.0f} tokens (code/prepare_tokens.py makes one)")


def command_verdict(est: dict, scheme: str) -> str:
    """What the printed command's own rows say: its memory against the limit, its communication against
    its compute at the micro-batch it prints."""
    m, st = est["memory"][scheme], est["step"]
    limit = USABLE_FRACTION * est["memory_gb"] * GB if est.get("memory_gb") else None
    said = [f"{memory.SCHEME_NAMES[scheme]} at micro-batch {st['micro_batch']}"]
    if limit is not None and m["total"] is not None:
        tight = m["total"] > NEAR_LIMIT * limit
        said.append(f"{m['total'] / GB:.2f} of {limit / GB:.3g} GB"
                    + (f" (within {1 - NEAR_LIMIT:.0%} of the limit: little room for the allocator's "
                       "fragmentation; measure the first steps' peak)" if tight else ""))
    if m["comm_s"] is not None:
        ratio = m["comm_s"] / st["compute_s"]
        if ratio > 1:
            how = "longer than compute: it cannot hide"
        elif ratio > BACKWARD_SHARE:
            how = "longer than backward: part of it shows in the step time"
        else:
            how = "shorter than backward: overlapped with it, it can hide"
        said.append(f"communication {ratio:.2f} of compute, {how}")
    return "verdict     the command below: " + "; ".join(said)


NEAR_LIMIT = 0.99  # a fit this close to the usable memory is flagged


def step_seconds(est: dict, scheme: str) -> float:
    """A step's time under a scheme: compute plus communication, not overlapped (as the table counts it)."""
    return est["step"]["compute_s"] + (est["memory"][scheme]["comm_s"] or 0)


def without_micro_batch(argv: list) -> list:
    """A command line without its --micro-batch (as "--micro-batch N" or "--micro-batch=N")."""
    return [a for i, a in enumerate(argv) if not (a == "--micro-batch" or a.startswith("--micro-batch=")
                                                  or (i and argv[i - 1] == "--micro-batch"))]


def plan_choices(argv: list, p: dict) -> tuple:
    """Every (micro-batch, scheme) pair up to the micro-batch asked that fits, fastest first by the time
    per token of compute plus communication (the budget counts the same MFU at every micro-batch, so a
    smaller micro-batch costs no compute here; on a GPU it often does). Returns (pairs, argv of the
    best plan, whether --checkpoint-activations had to be added)."""
    asked, checkpoint = p["est"]["step"]["micro_batch"], p["args"].checkpoint_activations
    base = without_micro_batch(argv)
    added = False
    est = p["est"]
    if not any(m["max_micro_batch"] for m in est["memory"].values()) and not checkpoint:
        with_ck = plan([*argv, "--checkpoint-activations"], fallback=False)
        if any(m["max_micro_batch"] for m in with_ck["est"]["memory"].values()):
            base, added, est = [*base, "--checkpoint-activations"], True, with_ck["est"]
    sizes = {b for b in (2 ** k for k in range(asked.bit_length())) if b <= asked} | {asked}
    sizes |= {m["max_micro_batch"] for m in est["memory"].values() if m["max_micro_batch"]}
    pairs = []
    for b in sorted(b for b in sizes if 0 < b <= asked):
        q_argv = [*base, "--micro-batch", str(b)]
        q = p if (b == asked and not added) else plan(q_argv, fallback=False)
        for s in script_fits(q["est"]):
            e = q["est"]
            pairs.append(dict(micro_batch=b, scheme=s, argv=q_argv, est=e, total=e["memory"][s]["total"],
                              step_s=step_seconds(e, s), per_token=step_seconds(e, s) / e["step"]["tokens"],
                              ratio=None if e["memory"][s]["comm_s"] is None
                              else e["memory"][s]["comm_s"] / e["step"]["compute_s"],
                              hours=e["step"]["steps"] * step_seconds(e, s) / 3600,
                              sent=e["memory"][s]["comm_bytes"]))
    order = list(SHARD_FLAGS)
    # fastest per token; without a link speed, the fewest bytes; ties to the larger micro-batch, then the
    # least sharded
    pairs.sort(key=lambda x: (x["per_token"] if x["ratio"] is not None else x["sent"] / x["est"]["step"]["tokens"],
                              -x["micro_batch"], order.index(x["scheme"])))
    return pairs, added


def beyond_data_parallel(argv: list) -> str:
    """What to do when one sequence fits nowhere: more GPUs, where ZeRO-3's shards shrink enough; else
    what no number of GPUs shrinks, one sequence's activations and logits beside one block's gathered
    weights, is larger than the GPU, and data parallelism stops (chapter 8)."""
    base = without_micro_batch(argv)
    q = plan([*base, "--micro-batch", "1", *([] if "--checkpoint-activations" in base
                                              else ["--checkpoint-activations"])], fallback=False)
    rows, limit = q["est"]["memory"], USABLE_FRACTION * q["memory_gb"] * GB
    parts = rows["zero3"]["parts"] if "zero3" in rows else rows["ddp"]["parts"]  # one GPU: DDP's row alone
    unshardable = _activations(parts) + _logits(parts) + (parts.get("gathered weights", 0) if "zero3" in rows else 0)
    if unshardable <= limit:
        return "shard over more GPUs (see the verdict)"
    return (f"more GPUs cannot fit it either: one sequence's activations and logits with checkpointing, and one "
            f"block's gathered weights, take {unshardable / GB:.2f} GB of the {limit / GB:.3g} GB usable whatever "
            "the number of GPUs; data parallelism stops here: a longer sequence needs context parallelism, a "
            "wider layer tensor parallelism (neither in train_gpu.py; chapter 8), or a GPU with more memory")


def choice_lines(argv: list, p: dict) -> list:
    """The command of the fastest (micro-batch, scheme) pair that fits; where it is not the micro-batch
    asked, the pairs compared and why."""
    pairs, added = plan_choices(argv, p)
    asked, checkpoint = p["est"]["step"]["micro_batch"], p["args"].checkpoint_activations
    if not pairs:
        return [f"command     none: not even one sequence per GPU fits under any scheme"
                f"{'' if checkpoint else ', with --checkpoint-activations or without'}; " + beyond_data_parallel(argv)]
    best = pairs[0]
    at_asked = [x for x in pairs if x["micro_batch"] == asked and not added]
    if at_asked and at_asked[0] is best:
        return command_lines_of(p)
    why = ("nothing fits at micro-batch " + str(asked) + ("" if checkpoint else " without checkpointing")
           if not at_asked else f"at micro-batch {asked} the fastest that fits is "
           f"{memory.SCHEME_NAMES[at_asked[0]['scheme']]}, slower than a smaller micro-batch")
    lines = [f"note        {why}; the plans that fit"
             + (" with --checkpoint-activations" if added else "")
             + ", fastest first (compute + communication per step, not overlapped; the budget counts the same "
             "MFU at every micro-batch, a GPU often runs smaller ones slower):",
             f"  {'micro-batch':>11}  {'scheme':<12} {'total GB':>9} {'step ms':>10} {'comm/compute':>13} "
             f"{'hours':>9}"]
    for x in pairs[:PLANS_SHOWN]:
        lines.append(f"  {x['micro_batch']:>11}  {memory.SCHEME_NAMES[x['scheme']]:<12} {x['total'] / GB:>9.2f} "
                     + (f"{x['step_s'] * 1e3:>10,.1f} {x['ratio']:>13.2f} {x['hours']:>9,.1f}"
                        if x["ratio"] is not None else f"{'?':>10} {'?':>13} {'?':>9}")
                     + ("   <- the command" if x is best else ""))
    lines.append(f"note        python code/budget.py {' '.join(best['argv'])} prints the command's rows")
    q = plan(best["argv"], fallback=False)
    return lines + command_lines_of(q)


PLANS_SHOWN = 6


def command_lines_of(p: dict) -> list:
    return command_lines(p["est"], p["shape"], p["args"].gpus_per_node, p["args"].layout,
                         p["args"].checkpoint_activations)


def _mfu(text: str) -> float:
    value = positive(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} is over 1: MFU is a fraction of the peak (e.g. 0.4 or 40%)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="budget.py", description="Estimate compute, time, cost and memory of a GPT training run. "
                           "With no arguments: print the rule of thumb's reference table and the corrected one.")
    p.add_argument("--model", choices=tuple(MODELS),
                   help="a named model: its shape, vocabulary and context (the default --seq-len): "
                        + "; ".join(f"{k} {m.source} (d {m.d_model}, L {m.n_layer}, V {m.vocab_size:,}, "
                                    f"s {m.seq_len})" for k, m in MODELS.items())
                        + ". Or give the shape with --d-model and --n-layer")
    p.add_argument("--params", type=positive, help="parameters N (e.g. 1.3e9 or 1.3B); default: from the shape")
    p.add_argument("--d-model", type=positive_int,
                   help="width d (with --n-layer: the shape, for FLOPs and memory)")
    p.add_argument("--n-layer", type=positive_int, help="layers L")
    p.add_argument("--n-head", type=positive_int, help="attention heads (default: d-model / 64)")
    p.add_argument("--vocab-size", type=positive_int,
                   help="vocabulary V: the logits' size, and N when derived from the shape. Default: the named "
                        f"model's, and a shape that is a named model's counts as that model (768 × 12 is GPT-2 "
                        f"124M: {GPT2_VOCAB:,}); any other shape {BOOK_VOCAB:,}, the book's tokenizer and "
                        "train_gpu.py's default. The output says which it used")
    p.add_argument("--gpus", type=positive_int, default=8, help="number of GPUs (default 8)")
    p.add_argument("--gpu", default="H100", help="GPU from the catalog: " + ", ".join(g.name for g in CATALOG))
    p.add_argument("--peak-tflops", type=positive, help="dense 16-bit peak per GPU in TFLOP/s (overrides --gpu)")
    p.add_argument("--memory-gb", type=positive, help="memory per GPU in GB (overrides --gpu)")
    p.add_argument("--mfu", type=_mfu, default=DEFAULT_MFU, help="model FLOPs utilisation, 0-1 (default 0.4)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--tokens-per-param", type=positive, default=DEFAULT_TOKENS_PER_PARAM,
                      help="training tokens D = this × N (default 20, Chinchilla)")
    data.add_argument("--tokens", type=positive, help="training tokens D (e.g. 20e9 or 20B)")
    p.add_argument("--seq-len", type=positive_int,
                   help=f"sequence length T (default: the named model's context, else {DEFAULT_SEQ_LEN})")
    p.add_argument("--micro-batch", type=positive_int,
                   help="sequences per GPU per forward (default: the named model's, "
                        + ", ".join(f"{k} {m.micro_batch}" for k, m in MODELS.items() if m.micro_batch != 8)
                        + "; else 8)")
    p.add_argument("--layout", choices=tuple(memory.LAYOUTS), default="autocast",
                   help="precision layout of the state: autocast (fp32 weights, as train_gpu.py; default) or "
                        "mixed (bf16 weights and grads + fp32 master, the ZeRO paper's 16 bytes; "
                        "Megatron-LM keeps fp32 grads: add --fp32-grads)")
    p.add_argument("--fp32-grads", action="store_true", help="with --layout mixed: fp32 gradients (18 bytes/param)")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="per-block activation checkpointing (train_gpu.py --checkpoint-activations)")
    p.add_argument("--price-per-gpu-hour", type=positive, help="rental price of one GPU for one hour")
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--global-batch-tokens", type=positive,
                       help="tokens per optimizer step over all GPUs; the accumulation is the whole number of "
                            "micro-batches nearest it. Default: GPT-3's batch for the nearest size (Brown et "
                            "al. 2020, Table 2.1: 0.5M tokens up to 760M parameters, 1M at 1.3B, 2M at 6.7B), "
                            "rounded to a multiple of 2^18 (0.5M: 524,288)")
    batch.add_argument("--grad-accum", type=positive_int,
                       help="micro-batches per GPU per optimizer step (default: from --global-batch-tokens)")
    p.add_argument("--grad-sync", choices=("auto", "last", "every"), default="auto",
                   help="FSDP during accumulation: last = hold the whole fp32 gradients and reduce-scatter on the "
                        "last micro-batch (train_gpu.py's default); every = reduce-scatter every micro-batch "
                        "(torchtitan's choice); "
                        "auto (default): last where it fits, else every")
    p.add_argument("--link-gb-s", type=positive,
                   help="GB/s one GPU sends to the others, per direction (default: the GPU's link in code/gpus.py)")
    p.add_argument("--gpus-per-node", type=positive_int, default=DEFAULT_GPUS_PER_NODE,
                   help=f"GPUs in one machine (default {DEFAULT_GPUS_PER_NODE}); more GPUs span machines")
    p.add_argument("--node-link-gbit", type=positive, default=DEFAULT_NODE_LINK_GBIT,
                   help=f"network port per GPU between machines, Gb/s "
                        f"(default {DEFAULT_NODE_LINK_GBIT}, InfiniBand NDR)")
    return p


def _finite(x) -> bool:
    """Whether every number in an estimate (nested dicts and lists) is finite."""
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(_finite(v) for v in x)
    return not isinstance(x, float) or math.isfinite(x)


def plan(argv: list, fallback: bool = True) -> dict:
    """Parse a command line (not empty) and estimate it: what main prints, as numbers. A bad argument
    ends in SystemExit with one line on stderr, as on the command line. fallback: where nothing fits,
    compare every smaller micro-batch and scheme that fits and print the fastest's command (choice_lines)."""
    parser = build_parser()
    # argparse takes "-1e9" for an option; glue such a value to its flag so the check below can name it
    merged = []
    for a in argv:
        if merged and merged[-1].startswith("--") and "=" not in merged[-1] and re.match(r"-[0-9.]", a):
            merged[-1] += "=" + a
        else:
            merged.append(a)
    args = parser.parse_args(merged)
    if args.model is not None and (args.d_model, args.n_layer, args.n_head) != (None, None, None):
        parser.error(f"--model {args.model} is a shape already: leave out --d-model, --n-layer and --n-head, "
                     "or give the shape without --model")
    if args.model is not None:
        m = MODELS[args.model]
        args.d_model, args.n_layer, args.n_head = m.d_model, m.n_layer, m.n_head
        if args.seq_len is None:
            args.seq_len = m.seq_len
    if args.seq_len is None:
        args.seq_len = DEFAULT_SEQ_LEN
    if args.micro_batch is None:
        args.micro_batch = MODELS[args.model].micro_batch if args.model is not None else NamedModel.micro_batch
    if args.params is None and (args.d_model is None or args.n_layer is None):
        parser.error("give the model size: --params, --model, or --d-model and --n-layer")
    if (args.d_model is None) != (args.n_layer is None):
        parser.error("give --d-model and --n-layer together (the shape), or neither")
    if args.fp32_grads and args.layout != "mixed":
        parser.error("--fp32-grads goes with --layout mixed (the autocast layout's gradients are fp32 already)")
    vocab, vocab_why = vocabulary(args.vocab_size, args.model, args.d_model, args.n_layer)
    shape = None
    if args.d_model is not None:
        n_head = args.n_head or max(1, args.d_model // 64)
        try:
            shape = memory.Shape(args.d_model, args.n_layer, n_head, args.seq_len, args.micro_batch, vocab)
        except ValueError as e:
            parser.error(f"{e}; choose --n-head so that d-model / n-head is even")
    elif args.n_head is not None or args.checkpoint_activations:
        parser.error("--n-head and --checkpoint-activations need the shape: --d-model and --n-layer")
    # one count everywhere: with a shape, the parameters train_gpu.py builds from it (FSDP's shards, the
    # bytes sent and the activations need the shape), whatever --params says; the report says so
    n = args.params if shape is None else param_count(args.d_model, args.n_layer, vocab)
    gpu = GPUS.get(args.gpu.lower())
    if gpu is None and args.peak_tflops is None:
        parser.error(f"unknown GPU {args.gpu!r}; known: {', '.join(g.name for g in CATALOG)} "
                     "(or give --peak-tflops and --memory-gb)")
    custom = args.peak_tflops is not None
    peak = args.peak_tflops * 1e12 if custom else gpu.peak_flops
    memory_gb = args.memory_gb if args.memory_gb is not None else (gpu.memory_gb if gpu else None)
    label = f"GPU ({peak / 1e12:g} TFLOP/s)" if custom else gpu.name
    if args.link_gb_s is not None:
        link_gb_s, link_label = args.link_gb_s, "--link-gb-s"
    elif not custom:
        link_gb_s, link_label = gpu.link_gb_s, gpu.link
    else:
        link_gb_s, link_label = None, ""
    link = link_bytes_per_s(args.gpus, link_gb_s, args.gpus_per_node, args.node_link_gbit)
    if link is not None and link < (link_gb_s or 0) * 1e9:
        link_label = f"{args.node_link_gbit:g} Gb/s network port between machines, slower than {link_label}"
    tokens = args.tokens if args.tokens is not None else args.tokens_per_param * n
    per_micro = args.gpus * args.micro_batch * args.seq_len
    if args.grad_accum is not None:
        target, batch_source = per_micro * args.grad_accum, f"--grad-accum {args.grad_accum}"
    elif args.global_batch_tokens is not None:
        target, batch_source = args.global_batch_tokens, f"--global-batch-tokens {args.global_batch_tokens:,.0f}"
    else:
        target, size = reference_batch_tokens(n)
        batch_source = (f"GPT-3's {GPT3_BATCH_NAMES[size]} for its {_size(size)} model, the size nearest "
                        f"this one (Brown et al. 2020, Table 2.1), rounded to a multiple of 2^18")
    grad_accum = args.grad_accum or accumulation(target, per_micro)
    est = estimate(n_params=n, gpus=args.gpus, peak_flops=peak, mfu=args.mfu, tokens=tokens, memory_gb=memory_gb,
                   shape=shape, layout=args.layout, fp32_grads=args.fp32_grads,
                   checkpoint=args.checkpoint_activations, price_per_gpu_hour=args.price_per_gpu_hour,
                   seq_len=args.seq_len, micro_batch=args.micro_batch, grad_accum=grad_accum,
                   link_bytes_s=link, grad_sync=args.grad_sync, gpus_per_node=args.gpus_per_node,
                   node_bytes_s=None if link_gb_s is None else link_gb_s * 1e9)
    est["step"].update(target_tokens=target, batch_source=batch_source)
    est.update(vocab_size=vocab, vocab_source=vocab_why, model=args.model, params_given=args.params)
    if not _finite(est) or not est["step"]["compute_s"] > 0:
        parser.error("these numbers are beyond what a float can hold (a result overflows); use realistic sizes")
    peak_label = "dense peak" if custom else f"{gpu.precision} dense peak"
    p = dict(args=args, est=est, shape=shape, label=label, peak=peak, memory_gb=memory_gb, link_gb_s=link_gb_s,
             link_label=link_label)
    est["memory_gb"] = memory_gb
    commands = command_lines_of(p)
    if fallback and commands and args.layout == "autocast":
        commands = choice_lines(merged, p)
    if any(x.startswith("command     torchrun") for x in commands):
        commands.insert(0, data_line(est))
    p["text"] = "\n".join([report(est, label, peak, args.mfu, memory_gb, args.layout, args.checkpoint_activations,
                                  link_label, args.fp32_grads, peak_label), *commands])
    return p


# ---- the calculator's memory figure: where each bar, line and label goes (calculator.js only draws) ----
FIGURE_FONT_PX = 11  # the figure's text (calculator.css: .calc-tick, .calc-value)
CHAR_EM = 0.75  # a bound on a label's width per character, in ems (DejaVu Sans Bold's digits: 0.70)
ASCENT_EM, DESCENT_EM = 0.95, 0.3  # a bound on how far a label reaches above and below its baseline
LEGEND_STEP = 16  # pixels between legend rows


def text_box(x: float, baseline: float, text: str, anchor: str = "start", font: float = FIGURE_FONT_PX) -> tuple:
    """A box (x0, y0, x1, y1) in pixels, y downwards, that holds `text` drawn at x with this anchor:
    the width from CHAR_EM, the height from ASCENT_EM and DESCENT_EM."""
    width = len(text) * CHAR_EM * font
    x0 = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
    return (x0, baseline - ASCENT_EM * font, x0 + width, baseline + DESCENT_EM * font)


def _overlap(a: tuple, b: tuple, gap: float = 0) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def _gb(x: float) -> str:
    """A figure's number: three significant digits, thousands separated (184, 11.4, 1,230)."""
    if x == 0:
        return "0"
    digits = 2 - math.floor(math.log10(abs(x)))
    r = round(x, digits)
    return f"{r:.{digits}f}".rstrip("0").rstrip(".") if digits > 0 else f"{r:,.0f}"


def _ticks(top: float, n: int = 5) -> list:
    """Round tick values from 0 to top: steps of 1, 2 or 5 times a power of ten."""
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(k for k in (1, 2, 5, 10) if k * mag >= raw) * mag
    return [round(i * step, 10) for i in range(int(top / step + 1e-9) + 1)]


def _label(x: float, y: float, text: str, anchor: str = "start") -> dict:
    return dict(x=x, y=y, text=text, anchor=anchor)


def label_box(label: dict) -> tuple:
    return text_box(label["x"], label["y"], label["text"], label["anchor"])


def memory_figure(memory_parts: dict, memory_gb: float | None, usable_gb: float | None) -> dict:
    """The memory figure, laid out in pixels (y downwards): for each scheme a stacked bar with its
    total above it, the GPU's memory and its usable 90 % as lines across the bars with their labels
    in the right margin, the legend below them there, the y axis's ticks. No label overlaps a line, a
    bar or another label: a total that would touch a line moves up past it, the margin's labels stack.
    Widths are bounded by CHAR_EM (tests/test_budget.py measures them with a real font)."""
    left, plot_w, top, plot_h, bottom = 56, 432, 24, 272, 36
    font, x_end = FIGURE_FONT_PX, left + plot_w
    schemes = list(memory_parts)
    parts = [p for p in dict.fromkeys(k for ps in memory_parts.values() for k in ps)
             if any(ps.get(p, 0) > 0 for ps in memory_parts.values())]
    # correctly rounded: Pyodide's CPython 3.12+ sums floats otherwise than 3.11, one ulp apart
    totals = [math.fsum(memory_parts[s].values()) for s in schemes]
    limits = [] if memory_gb is None else [(memory_gb, f"GPU memory {_gb(memory_gb)} GB", False),
                                           (usable_gb, f"usable 90%: {_gb(usable_gb)} GB", True)]
    margin = [text_box(0, 0, text) for _, text, _ in limits] + [text_box(14, 0, p) for p in parts]
    width = math.ceil(x_end + 6 + max([160, *(box[2] for box in margin)]) + 4)  # the right margin holds them all
    band = (x_end - left) / max(1, len(schemes))
    bar_w = band * 0.56
    ymax = max([*totals, memory_gb or 0]) * 1.08 or 1.0
    while True:  # widen the axis until every total's label, moved past the lines, stays inside the figure
        lines = sorted((top + plot_h * (1 - v / ymax) for v, _, _ in limits), reverse=True)  # lowest first
        labels = []
        for i, total in enumerate(totals):
            label = _label(left + band * (i + 0.5), top + plot_h * (1 - total / ymax) - 4, _gb(total), "middle")
            for ly in lines:  # past one line, the next may be in the way
                box = label_box(label)
                if box[1] - 2 < ly < box[3] + 2:
                    label["y"] = ly - 3 - DESCENT_EM * font
            labels.append(label)
        if all(label_box(lab)[1] >= 2 for lab in labels):
            break
        ymax *= 1.1

    def y(v):
        return top + plot_h * (1 - v / ymax)

    bars = []
    for i, (s, total, label) in enumerate(zip(schemes, totals, labels)):
        x0, acc, segments = left + band * (i + 0.5) - bar_w / 2, 0.0, []
        for k, p in enumerate(parts):
            v = memory_parts[s].get(p, 0)
            if v > 0:
                segments.append(dict(part=p, color=k, gb=v, y=y(acc + v), height=y(acc) - y(acc + v)))
            acc += v
        bars.append(dict(scheme=s, x=x0, width=bar_w, total=total, segments=segments, label=label,
                         tick=_label(x0 + bar_w / 2, top + plot_h + 16, s, "middle")))
    margin_x, placed, rows = x_end + 6, [], []
    for v, text, dashed in sorted(limits, key=lambda row: -row[0]):  # centred on its line, below the one above
        label = _label(margin_x, y(v) + 0.35 * font, text)
        if placed and label_box(label)[1] < placed[-1][3] + 2:
            label["y"] = placed[-1][3] + 2 + ASCENT_EM * font
        placed.append(label_box(label))
        rows.append(dict(gb=v, y=y(v), x1=left, x2=x_end, dashed=dashed, label=label))
    legend, base = [], top + 10
    for p in reversed(parts):  # the top part first, as the bars stack; a row skips the lines' labels
        while any(_overlap((margin_x, *label_box(_label(margin_x + 14, base, p))[1:]), box, 2) for box in placed):
            base += 2
        legend.append(dict(part=p, color=parts.index(p), swatch=[margin_x, base - 9, 10, 10],
                           label=_label(margin_x + 14, base, p)))
        base += LEGEND_STEP
    height = max([top + plot_h + bottom, *(label_box(e["label"])[3] + 4 for e in legend),
                  *(box[3] + 4 for box in placed)])
    ticks = [dict(y=y(t), label=_label(left - 6, y(t) + 4, _gb(t), "end")) for t in _ticks(ymax)]
    return dict(width=width, height=math.ceil(height), plot=[left, top, x_end, top + plot_h], ymax=ymax,
                parts=parts, bars=bars, limits=rows, legend=legend, ticks=ticks,
                axis_label=_label(14, top + plot_h / 2, "GB per GPU at the step's peak", "middle"))


def page(argv: list) -> dict:
    """What chapter 12's calculator shows for a command line: the text main prints, or the one-line
    error it ends with; and its two figures: memory per GPU by part for each scheme (the numbers, and
    the figure laid out by memory_figure) and hours and cost against the number of GPUs at the plan's
    global batch (compute alone, and with each scheme's communication added, not overlapped: the cost
    of GPUs that wait). JSON-ready (the page runs this under Pyodide)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            p = plan(argv)
    except SystemExit:
        return dict(ok=False, error=err.getvalue().strip(), text="")
    args, est = p["args"], p["est"]
    parts = {s: m["parts"] if "parts" in m else peak_parts(  # no shape: the model state alone
        None, est["n_params"], args.gpus, s, args.layout, args.fp32_grads, grad_accum=est["step"]["grad_accum"],
        sync_every=m["sync_every"]) for s, m in est["memory"].items()}
    memory_parts = {memory.SCHEME_NAMES[s]: {k: v / GB for k, v in ps.items() if k != "total"}
                    for s, ps in parts.items()}
    counts = sorted({2 ** k for k in range(13) if 2 ** k <= max(64, 4 * args.gpus)} | {args.gpus})
    schemes = budget_schemes(max(counts), args.gpus_per_node, args.layout)  # HSDP where a count spans machines
    sweep = dict(gpus=counts, hours=[], cost=[], hours_with_comm={memory.SCHEME_NAMES[s]: [] for s in schemes},
                 cost_with_comm={memory.SCHEME_NAMES[s]: [] for s in schemes})
    for g in counts:  # the plan's global batch on g GPUs: the accumulation nearest it
        e = estimate(n_params=est["n_params"], gpus=g, peak_flops=p["peak"], mfu=args.mfu, tokens=est["tokens"],
                     shape=p["shape"], layout=args.layout, fp32_grads=args.fp32_grads,
                     price_per_gpu_hour=args.price_per_gpu_hour, seq_len=args.seq_len, micro_batch=args.micro_batch,
                     grad_accum=accumulation(est["step"]["tokens"], g * args.micro_batch * args.seq_len),
                     grad_sync=args.grad_sync, checkpoint=args.checkpoint_activations,
                     link_bytes_s=link_bytes_per_s(g, p["link_gb_s"], args.gpus_per_node, args.node_link_gbit),
                     node_bytes_s=None if p["link_gb_s"] is None else p["link_gb_s"] * 1e9,
                     gpus_per_node=args.gpus_per_node)
        sweep["hours"].append(e["hours"])
        sweep["cost"].append(e["cost"])
        for s in schemes:
            m = e["memory"].get(s)  # HSDP on one machine: no point of its own
            if m is None and g == 1 and s in memory.SCHEMES:  # one GPU: each is DDP's run (budget_schemes)
                m = e["memory"]["ddp"]
            comm, price = None if m is None else m["comm_s"], args.price_per_gpu_hour
            hours = None if comm is None else e["step"]["steps"] * (e["step"]["compute_s"] + comm) / 3600
            sweep["hours_with_comm"][memory.SCHEME_NAMES[s]].append(hours)
            sweep["cost_with_comm"][memory.SCHEME_NAMES[s]].append(
                None if hours is None or price is None else hours * g * price)
    usable = None if p["memory_gb"] is None else USABLE_FRACTION * p["memory_gb"]
    drawn = any(v > 0 for ps in memory_parts.values() for v in ps.values())
    return dict(ok=True, error="", text=p["text"], memory=memory_parts, memory_gb=p["memory_gb"], usable_gb=usable,
                memory_figure=memory_figure(memory_parts, p["memory_gb"], usable) if drawn else None,
                gpus=args.gpus, sweep=sweep)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("The rule of thumb: H100 (989 TFLOP/s bf16, 80 GB), MFU 40%, D = 20N, FLOPs = 6ND, "
              "state 16 B/param, activations 34·s·b·h·L bytes, no logits")
        print(rule_of_thumb_table())
        print(f"\nCorrected by the memory ledger (code/memory.py): this model's N at each shape with vocabulary "
              f"{REFERENCE_VOCAB:,}, D = 20N, FLOPs = (6N + 12·L·T·d)·D, {memory.LAYOUT_NAMES['autocast']}, "
              f"peak = state + activations + logits")
        print(corrected_table())
        return
    print(plan(argv)["text"])


if __name__ == "__main__":
    main()
