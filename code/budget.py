"""Plan a training run before renting GPUs: compute, hours, cost and memory per GPU.

    python code/budget.py                                  # the book's reference table
    python code/budget.py --params 1e9 --gpus 8 --gpu H100 --d-model 2048 --n-layer 20
    python code/budget.py --d-model 768 --n-layer 12 --vocab-size 8192 --gpus 1 --gpu RTX4090 \
        --seq-len 1024 --micro-batch 8 --tokens 3e9 --price-per-gpu-hour 0.6

The assumptions (each one a flag where a reader may differ):
  compute     FLOPs = 6·N·D (forward 2N, backward 4N per token; attention's share is left out);
  data        D = 20·N tokens (Chinchilla's compute-optimal ratio) unless --tokens is given;
  time        hours = FLOPs / (GPUs · peak · MFU) / 3600, with the GPU's dense bf16 peak and MFU 40 %;
  state       16 bytes per parameter: bf16 weights (2) and grads (2), fp32 master weights (4) and the
              two fp32 Adam moments (4 + 4). DDP keeps all of it on every GPU; ZeRO-1 splits the 12 bytes
              of fp32 optimizer state across GPUs, ZeRO-2 also the grads, ZeRO-3/FSDP everything;
  activations 34·s·b·h bytes per layer (bf16, FlashAttention, no recomputation; Korthikanti et al.
              2022 without the attention-matrix term), times L layers, the same under every scheme;
  memory      GB = 1e9 bytes; a run "fits" when state + activations stay under 90 % of the GPU's memory
              (the rest goes to the CUDA context, allocator fragmentation, the logits and temporaries).
"""
import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpus import CATALOG, GPUS  # noqa: E402
from script_support import Parser, positive, positive_int  # noqa: E402

BYTES_PER_PARAM = 16  # bf16 weights 2 + bf16 grads 2 + fp32 master 4 + Adam m 4 + Adam v 4
OPTIMIZER_BYTES = 12  # the fp32 part: master weights and the two moments
GRAD_BYTES = 2
WEIGHT_BYTES = 2
ACT_COEFF = 34  # bytes per (token · hidden unit) in one layer
USABLE_FRACTION = 0.9
GB = 1e9
DEFAULT_MFU = 0.40
DEFAULT_TOKENS_PER_PARAM = 20


@dataclass(frozen=True)
class Scenario:
    label: str
    n_params: float
    d_model: int
    n_layer: int
    seq_len: int
    micro_batch: int
    gpus: int


# The book's reference scenarios: nominal sizes, H100s, MFU 40 %, D = 20N.
REFERENCE = (
    Scenario("124M (GPT-2; h 768, L 12, s 1024, b 16)", 124e6, 768, 12, 1024, 16, 1),
    Scenario("1.3B (h 2048, L 24, s 2048, b 8)", 1.3e9, 2048, 24, 2048, 8, 8),
    Scenario("7B (h 4096, L 32, s 4096, b 2)", 7e9, 4096, 32, 4096, 2, 64),
)


def train_flops(n_params: float, tokens: float) -> float:
    return 6 * n_params * tokens


def train_hours(flops: float, gpus: int, peak_flops: float, mfu: float) -> float:
    return flops / (gpus * peak_flops * mfu) / 3600


def state_bytes(n_params: float, gpus: int, scheme: str = "ddp") -> float:
    """Model + optimizer state per GPU. ZeRO-1 shards the optimizer, ZeRO-2 also the grads,
    ZeRO-3 (FSDP) also the weights."""
    sharded = {"ddp": 0, "zero1": OPTIMIZER_BYTES, "zero2": OPTIMIZER_BYTES + GRAD_BYTES,
               "zero3": BYTES_PER_PARAM}[scheme]
    return n_params * ((BYTES_PER_PARAM - sharded) + sharded / gpus)


def activation_bytes(seq_len: int, micro_batch: int, d_model: int, n_layer: int) -> float:
    return ACT_COEFF * seq_len * micro_batch * d_model * n_layer


def params_of(d_model: int, n_layer: int, vocab_size: int = 8192) -> int:
    """Parameters of the book's GPT (code/model.py) with this shape, counted on the meta device."""
    import torch
    from model import GPT, GPTConfig
    with torch.device("meta"):  # no memory: only shapes
        model = GPT(GPTConfig(vocab_size=vocab_size, d_model=d_model, n_layer=n_layer, n_head=1, seq_len=2))
    return model.num_params()


def max_micro_batch(n_params, gpus, scheme, seq_len, d_model, n_layer, memory_gb) -> int:
    """The largest micro-batch whose state + activations fit the usable memory (0: none)."""
    free = USABLE_FRACTION * memory_gb * GB - state_bytes(n_params, gpus, scheme)
    return max(0, int(free // activation_bytes(seq_len, 1, d_model, n_layer)))


def reference_rows(peak_flops: float = 989e12, mfu: float = DEFAULT_MFU) -> list:
    rows = []
    for sc in REFERENCE:
        tokens = DEFAULT_TOKENS_PER_PARAM * sc.n_params
        flops = train_flops(sc.n_params, tokens)
        rows.append(dict(
            scenario=sc, tokens=tokens, flops=flops, gpus=sc.gpus,
            hours=train_hours(flops, sc.gpus, peak_flops, mfu),
            state_ddp=state_bytes(sc.n_params, sc.gpus, "ddp"),
            state_fsdp=state_bytes(sc.n_params, sc.gpus, "zero3"),
            activations=activation_bytes(sc.seq_len, sc.micro_batch, sc.d_model, sc.n_layer)))
    return rows


def sci(x: float, digits: int = 1) -> str:
    """1.845e18 -> '1.8e18' (the table's notation, without Python's '+' and leading zeros)."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def reference_table() -> str:
    lines = ["| model | tokens | FLOPs | GPUs | hours | state DDP | state FSDP | activations |",
             "|---|---|---|---|---|---|---|---|"]
    for r in reference_rows():
        lines.append(
            f"| {r['scenario'].label} | {r['tokens'] / 1e9:.1f}B | {sci(r['flops'])} | {r['gpus']} | "
            f"{r['hours']:.1f} | {r['state_ddp'] / GB:.1f} GB | {r['state_fsdp'] / GB:.2f} GB | "
            f"{r['activations'] / GB:.1f} GB |")
    return "\n".join(lines)


def estimate(n_params, gpus, peak_flops, mfu, tokens, memory_gb=None, seq_len=None, micro_batch=None,
             d_model=None, n_layer=None, price_per_gpu_hour=None) -> dict:
    """Everything the command line prints, as numbers (bytes, FLOPs, hours)."""
    flops = train_flops(n_params, tokens)
    hours = train_hours(flops, gpus, peak_flops, mfu)
    out = dict(n_params=n_params, tokens=tokens, flops=flops, gpus=gpus, hours=hours,
               gpu_hours=hours * gpus, cost=None if price_per_gpu_hour is None else hours * gpus * price_per_gpu_hour)
    act = None
    if None not in (seq_len, micro_batch, d_model, n_layer):
        act = activation_bytes(seq_len, micro_batch, d_model, n_layer)
    out["activations"] = act
    out["memory"] = {}
    for scheme in ("ddp", "zero1", "zero2", "zero3"):
        st = state_bytes(n_params, gpus, scheme)
        total = None if act is None else st + act
        fits = None if (total is None or memory_gb is None) else total <= USABLE_FRACTION * memory_gb * GB
        mb = None
        if memory_gb is not None and None not in (seq_len, d_model, n_layer):
            mb = max_micro_batch(n_params, gpus, scheme, seq_len, d_model, n_layer, memory_gb)
        out["memory"][scheme] = dict(state=st, total=total, fits=fits, max_micro_batch=mb)
    return out


SCHEME_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3/FSDP"}


def report(est: dict, gpu_label: str, peak_flops: float, mfu: float, memory_gb) -> str:
    n, d = est["n_params"], est["tokens"]
    lines = [
        f"model       {n / 1e9:.3f}B parameters, {d / 1e9:.1f}B tokens ({d / n:.1f} tokens/param)",
        f"compute     6·N·D = {sci(est['flops'], 2)} FLOPs",
        f"hardware    {est['gpus']} × {gpu_label}: {peak_flops / 1e12:.1f} TFLOP/s bf16 peak each, "
        f"MFU {mfu:.0%} → {est['gpus'] * peak_flops * mfu / 1e12:.0f} TFLOP/s achieved",
        f"time        {est['hours']:,.2f} hours ({est['hours'] / 24:,.2f} days), {est['gpu_hours']:,.1f} GPU-hours",
    ]
    if est["cost"] is not None:
        lines.append(f"cost        {est['cost']:,.0f} (GPU-hours × price per GPU-hour)")
    lines.append("memory per GPU (GB; state = 16 bytes/param, split as each scheme splits it):")
    act = est["activations"]
    limit = None if memory_gb is None else USABLE_FRACTION * memory_gb
    header = f"  {'scheme':<12} {'state':>8} {'activations':>12} {'total':>8}"
    if limit is not None:
        header += f"   fits {limit:.0f} of {memory_gb:g} GB?  max micro-batch"
    lines.append(header)
    for scheme, m in est["memory"].items():
        row = f"  {SCHEME_NAMES[scheme]:<12} {m['state'] / GB:>8.2f} "
        row += f"{act / GB:>12.2f} {m['total'] / GB:>8.2f}" if act is not None else f"{'?':>12} {'?':>8}"
        if limit is not None:
            row += f"   {'?' if m['fits'] is None else ('yes' if m['fits'] else 'no'):<19}"
            row += f"  {'?' if m['max_micro_batch'] is None else m['max_micro_batch']}"
        lines.append(row)
    if act is None:
        lines.append("  (activations need --d-model, --n-layer, --seq-len and --micro-batch)")
    elif limit is not None:
        fitting = [s for s, m in est["memory"].items() if m["fits"]]
        if fitting:
            lines.append(f"verdict     fits under {SCHEME_NAMES[fitting[0]]}"
                         + ("" if fitting[0] == "ddp" else " (not under plain DDP)"))
        else:
            lines.append("verdict     fits under no scheme: lower --micro-batch, recompute activations, "
                         "or shard over more GPUs")
    return "\n".join(lines)


def _mfu(text: str) -> float:
    value = positive(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} is over 1: MFU is a fraction of the peak (e.g. 0.4 or 40%)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = Parser(description="Estimate compute, time, cost and memory of a GPT training run. "
                                "With no arguments: print the book's reference table.")
    p.add_argument("--params", type=positive, help="parameters N (e.g. 1.3e9 or 1.3B)")
    p.add_argument("--d-model", type=positive_int, help="hidden size h (with --n-layer: derives N if --params is absent)")
    p.add_argument("--n-layer", type=positive_int, help="layers L")
    p.add_argument("--vocab-size", type=positive_int, default=8192, help="vocabulary, to derive N (default 8192)")
    p.add_argument("--gpus", type=positive_int, default=8, help="number of GPUs (default 8)")
    p.add_argument("--gpu", default="H100", help="GPU from the catalog: " + ", ".join(g.name for g in CATALOG))
    p.add_argument("--peak-tflops", type=positive, help="dense bf16 peak per GPU in TFLOP/s (overrides --gpu)")
    p.add_argument("--memory-gb", type=positive, help="memory per GPU in GB (overrides --gpu)")
    p.add_argument("--mfu", type=_mfu, default=DEFAULT_MFU, help="model FLOPs utilisation, 0-1 (default 0.4)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--tokens-per-param", type=positive, default=DEFAULT_TOKENS_PER_PARAM,
                      help="training tokens D = this × N (default 20, Chinchilla)")
    data.add_argument("--tokens", type=positive, help="training tokens D (e.g. 20e9 or 20B)")
    p.add_argument("--seq-len", type=positive_int, default=2048, help="sequence length s (default 2048)")
    p.add_argument("--micro-batch", type=positive_int, default=8, help="sequences per GPU per forward (default 8)")
    p.add_argument("--price-per-gpu-hour", type=positive, help="rental price of one GPU for one hour")
    return p


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("Reference table: H100 (989 TFLOP/s bf16, 80 GB), MFU 40%, D = 20N, FLOPs = 6ND, "
              "state 16 B/param, activations 34·s·b·h·L bytes")
        print(reference_table())
        return
    parser = build_parser()
    # argparse takes "-1e9" for an option; glue such a value to its flag so the check below can name it
    merged = []
    for a in argv:
        if merged and merged[-1].startswith("--") and "=" not in merged[-1] and re.match(r"-[0-9.]", a):
            merged[-1] += "=" + a
        else:
            merged.append(a)
    args = parser.parse_args(merged)
    if args.params is None and (args.d_model is None or args.n_layer is None):
        parser.error("give the model size: --params, or --d-model and --n-layer")
    if args.d_model is not None and args.d_model % 2:
        parser.error(f"--d-model {args.d_model} must be even (the book's model uses RoPE)")
    n = args.params if args.params is not None else params_of(args.d_model, args.n_layer, args.vocab_size)
    gpu = GPUS.get(args.gpu.lower())
    if gpu is None and args.peak_tflops is None:
        parser.error(f"unknown GPU {args.gpu!r}; known: {', '.join(g.name for g in CATALOG)} "
                     "(or give --peak-tflops and --memory-gb)")
    peak = args.peak_tflops * 1e12 if args.peak_tflops is not None else gpu.peak_flops
    memory = args.memory_gb if args.memory_gb is not None else (gpu.memory_gb if gpu else None)
    label = gpu.name if gpu is not None and args.peak_tflops is None else f"GPU ({peak / 1e12:g} TFLOP/s)"
    tokens = args.tokens if args.tokens is not None else args.tokens_per_param * n
    h, L = args.d_model, args.n_layer
    est = estimate(n, args.gpus, peak, args.mfu, tokens, memory, args.seq_len, args.micro_batch, h, L,
                   args.price_per_gpu_hour)
    print(report(est, label, peak, args.mfu, memory))


if __name__ == "__main__":
    main()
