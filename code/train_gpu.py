"""Train the book's GPT on one or several GPUs.

    python code/train_gpu.py                                         # 1 GPU
    torchrun --standalone --nproc-per-node 8 code/train_gpu.py       # 8 GPUs, DDP
    python code/train_gpu.py --device cpu --d-model 64 --n-layer 2 --n-head 2 --seq-len 64 \
        --micro-batch 4 --steps 20 --log-every 5 --out /tmp/smoke   # the same logic on a CPU

    # two machines (run on each; see launch/ for Slurm and SkyPilot):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        --rdzv-id RUN code/train_gpu.py

On CUDA: TF32 for the remaining fp32 matmuls, torch.compile, DDP (NCCL) that skips the gradient
all-reduce on all but the last micro-batch, fused AdamW, pinned host memory with non-blocking copies.
On a CPU: fp32, gloo, plain AdamW, no compile by default.

Precision (--precision auto): bf16 autocast over fp32 master weights where the GPU has bf16
(torch.cuda.is_bf16_supported, Ampere and later); otherwise fp16 autocast with a GradScaler, which
skips a step whose gradients overflowed (counted in the log); fp32 on a CPU. MFU is measured against
the dense tensor peak of the GPU looked up by name and SM count (code/gpus.py).
Gradient accumulation steps = global batch tokens / (micro-batch · seq-len · processes).
--checkpoint-activations keeps only each block's input and recomputes the block during backward
(GPT.checkpoint_blocks): less activation memory for about one more forward pass, same parameters.

Memory: on CUDA the log puts torch's peak allocation beside what the memory ledger (code/memory.py)
predicts for this shape under eager autograd; torch.compile usually needs less than the ledger.

Data: the book's tokens (default) or --data PATH, a flat file of uint16 token ids (see
code/prepare_tokens.py), read through np.memmap so a corpus of many GB never has to fit in memory.
Every process draws the same global micro-batch from one seeded generator and keeps its own rows, so
a run on N processes sees the data a 1-process run sees.

Evaluation (--eval-every N): validation loss and bits per byte (train.bits_per_byte) on fixed batches
of held-out tokens: the book's val split, or the last 5% of a --data file (not trained on). Bits per
byte need the tokenizer: the book's, --tokenizer, or the one prepare_tokens.py wrote beside the file.
At the end rank 0 prints a short sample of generated text.

Run log (rank 0): OUT/run.json (command line, every argument, git commit, devices, versions, start and
end time; rewritten atomically) and OUT/log.jsonl (one JSON line per log step, fsynced).

Checkpoints (OUT/ckpt.pt: model, optimizer, step, sampler and RNG states) are written by rank 0 to a
temporary file and renamed, so a run killed at any moment leaves the previous checkpoint intact;
--resume continues it and ends with the same parameters as an uninterrupted run. A ckpt.pt.tmp left by
a kill is removed on the next start. Every bad input (settings, checkpoint, data, --out) is one line
on stderr and a non-zero exit before any training starts.
"""
import argparse
import contextlib
import datetime
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import CorpusError, fixed_batches, get_batch, load_tokenizer, load_tokens, token_bytes, tokenizer_path_for  # noqa: E402,E501
from gpus import describe_peak  # noqa: E402
from measure import git_state  # noqa: E402
from shapes import flops_per_token  # noqa: E402
from memory import Shape, step_bytes  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from script_support import (Parser, ScaledLoss, accumulate_gradients, append_jsonl, fail, generate,  # noqa: E402
                            launch_ranks, mean_across_ranks, output_problem, process_group, save_atomic, set_lr,
                            write_json, atomic_write)
from train import bits_per_byte, configure_optimizer, evaluate, lr_at  # noqa: E402

CKPT_NAME = "ckpt.pt"
LOG_NAME = "log.jsonl"
RECORD_NAME = "run.json"
CKPT_KEYS = {"model", "optimizer", "step", "model_config", "sampler_rng", "cpu_rng"}
HOLDOUT = 0.05  # the last 5% of a --data file is validation
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(description="Train the book's GPT on 1..N GPUs (or a CPU, as a smoke test).")
    a = p.add_argument
    a("--d-model", type=int, default=512)
    a("--n-layer", type=int, default=8)
    a("--n-head", type=int, default=8)
    a("--seq-len", type=int, default=512)
    a("--vocab-size", type=int, default=8192)
    a("--micro-batch", type=int, default=32, help="sequences per process per forward pass")
    a("--global-batch-tokens", type=int, default=None,
      help="tokens per optimizer step over all processes (default: micro-batch·seq-len·4·processes)")
    a("--steps", type=int, default=2000)
    a("--lr", type=float, default=1e-3)
    a("--warmup", type=int, default=100)
    a("--min-lr-ratio", type=float, default=0.1)
    a("--weight-decay", type=float, default=0.1)
    a("--grad-clip", type=float, default=1.0)
    a("--seed", type=int, default=0)
    a("--data", default=None, help="uint16 token file (code/prepare_tokens.py); default: the book's tokens. "
      "Its last 5%% is held out for validation and never trained on")
    a("--tokenizer", default=None, help="SentencePiece model of --data, for bits per byte and the sample "
      "(default: the book's, or DATA's .tokenizer.model written by prepare_tokens.py)")
    a("--out", default="out_gpu", help="folder for the checkpoint, run.json and log.jsonl")
    a("--save-every", type=int, default=500, help="steps between checkpoints (0: only at the end)")
    a("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    a("--log-every", type=int, default=50)
    a("--eval-every", type=int, default=0, help="steps between validation evaluations (0: none)")
    a("--eval-batches", type=int, default=8, help="fixed validation micro-batches per evaluation")
    a("--sample-tokens", type=int, default=64, help="tokens of text generated at the end (0: none)")
    a("--device", choices=("cuda", "cpu"), default="cuda")
    a("--precision", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
      help="auto: bf16 where the GPU has it, else fp16 with loss scaling; fp32 on a CPU")
    a("--compile", action=argparse.BooleanOptionalAction, default=None,
      help="torch.compile the model (default: on for CUDA, off for CPU)")
    a("--checkpoint-activations", action="store_true",
      help="recompute each block's activations during backward instead of keeping them (less memory)")
    a("--peak-tflops", type=float, default=None, help="GPU peak for MFU if the name lookup does not know it")
    a("--inject-nan-at", type=int, default=None, help=argparse.SUPPRESS)  # tests the NaN guard
    a("--inject-inf-grad-at", type=int, default=None, help=argparse.SUPPRESS)  # tests fp16 step skipping
    return p


def check_args(args, world: int) -> int:
    """Validate settings; return the number of accumulation steps."""
    for name in ("d_model", "n_layer", "n_head", "seq_len", "vocab_size", "micro_batch", "steps", "log_every"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.d_model % args.n_head or (args.d_model // args.n_head) % 2:
        fail(f"--d-model {args.d_model} must split into --n-head {args.n_head} heads of even size (RoPE)")
    if args.save_every < 0 or args.warmup < 0 or not args.lr > 0:
        fail("--save-every and --warmup must be >= 0 and --lr > 0")
    if args.eval_every < 0 or args.eval_batches <= 0 or args.sample_tokens < 0:
        fail("--eval-every and --sample-tokens must be >= 0 and --eval-batches > 0")
    if args.vocab_size > 65536 and args.data:
        fail("uint16 token files hold ids below 65,536; --vocab-size is larger")
    per_micro = args.micro_batch * args.seq_len * world
    if args.global_batch_tokens is None:
        args.global_batch_tokens = per_micro * 4
    if args.global_batch_tokens <= 0 or args.global_batch_tokens % per_micro:
        fail(f"--global-batch-tokens {args.global_batch_tokens:,} is not a positive multiple of micro-batch × "
             f"seq-len × processes = {args.micro_batch} × {args.seq_len} × {world} = {per_micro:,}; "
             f"use e.g. {per_micro * max(1, round(args.global_batch_tokens / per_micro)):,}")
    return args.global_batch_tokens // per_micro


def setup_device(args, local_rank: int) -> torch.device:
    """The device this process trains on: GPU number local_rank, or the CPU."""
    if args.device == "cuda":
        if not torch.cuda.is_available():
            fail("--device cuda was asked for, but this machine has no CUDA GPU that torch can use; "
                 "for a smoke test on the CPU add --device cpu and a tiny config")
        if local_rank >= torch.cuda.device_count():
            fail(f"process {local_rank} needs GPU {local_rank}, but only {torch.cuda.device_count()} are visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


class TokenSource:
    """Training and validation tokens as 1-D tensors: the book's (int64) or a uint16 memmap (no copy
    into memory) whose last 5% is held out; and the tokenizer if it is known (else None)."""

    def __init__(self, path, vocab_size: int, seq_len: int, tokenizer=None):
        need = seq_len + 2  # one window of seq_len + 1 tokens, and room to draw it
        if path is None:
            try:
                book = load_tokens()
            except CorpusError as e:
                fail(str(e))
            self.train, self.val = book.train, book.val
            self.name = "the book's 全宋词 tokens"
            default_tok = "book"
        else:
            path = Path(path)
            if not path.is_file():
                fail(f"--data {path} does not exist or is not a file (make one with code/prepare_tokens.py)")
            size = path.stat().st_size
            if size % 2 or size == 0:
                fail(f"--data {path.name} is not a uint16 token file (its size is odd or zero)")
            if size // 2 < need:
                fail(f"--data {path.name} holds {size // 2:,} tokens, fewer than one sequence "
                     f"(--seq-len {seq_len} + 2); use a longer file or a shorter --seq-len")
            # copy-on-write: a writable view for torch that never writes back to the file
            arr = np.memmap(path, dtype=np.uint16, mode="c")
            top = max(int(arr[i:i + (1 << 26)].max()) for i in range(0, len(arr), 1 << 26))
            if top >= vocab_size:
                fail(f"--data {path.name} holds token id {top}, beyond --vocab-size {vocab_size}")
            tokens = torch.from_numpy(arr)
            n_val = int(len(tokens) * HOLDOUT)
            if n_val < need or len(tokens) - n_val < need:
                fail(f"--data {path.name} holds {len(tokens):,} tokens: its last 5% ({n_val:,}) held out for "
                     f"validation is shorter than one sequence (--seq-len {seq_len} + 2); use a longer file")
            self.train, self.val = tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]
            self.name = f"{path.name} (uint16 memmap; last 5%, {n_val:,} tokens, held out)"
            default_tok = tokenizer_path_for(path) if tokenizer_path_for(path).is_file() else None
        self.tokenizer, self.tokenizer_name = self._tokenizer(tokenizer or default_tok, vocab_size)

    @staticmethod
    def _tokenizer(source, vocab_size):
        if source is None:
            return None, "unknown (no bits per byte, no sample text)"
        if source == "book":
            return load_tokenizer(), "the book's"
        import sentencepiece as spm
        path = Path(source)
        if not path.is_file():
            fail(f"--tokenizer {path} does not exist")
        try:
            sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError):
            fail(f"--tokenizer {path.name} is not a SentencePiece model")
        if sp.get_piece_size() > vocab_size:
            fail(f"--tokenizer {path.name} has {sp.get_piece_size():,} ids, more than --vocab-size {vocab_size:,}")
        return sp, path.name

    def __len__(self):
        return len(self.train)


def peak_flops(device, override_tflops):
    """(peak FLOP/s per GPU or None, a note for the log)."""
    if device.type != "cuda":
        return None, "no MFU on CPU (no spec peak to compare with)"
    name = torch.cuda.get_device_name(device)
    if override_tflops:
        return override_tflops * 1e12, f"{name}: peak {override_tflops:g} TFLOP/s from --peak-tflops"
    return describe_peak(name, torch.cuda.get_device_properties(device).multi_processor_count)


def resolve_precision(choice: str, device: torch.device) -> str:
    """auto: bf16 where the GPU has bf16 tensor cores, fp16 (with loss scaling) where it has not, fp32 on a CPU."""
    if device.type != "cuda":
        return "fp32" if choice == "auto" else choice  # CPU autocast: slow, but the same code path
    try:  # without emulation: Volta and Turing "support" bf16 only in slow emulation
        has_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:
        has_bf16 = torch.cuda.is_bf16_supported()
    if choice == "auto":
        return "bf16" if has_bf16 else "fp16"
    if choice == "bf16" and not has_bf16:
        fail(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 tensor cores; use fp16 or auto")
    return choice


def read_checkpoint(path: Path, model_config: dict) -> dict:
    """The checkpoint to resume from, on the CPU; one line and exit 1 if it is truncated or foreign."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many kinds for a damaged file; all mean the same here
        fail(f"--resume: {path} cannot be read as a checkpoint ({type(e).__name__}); it is truncated or not "
             f"a torch file. Start again without --resume in a new --out")
    if not isinstance(ck, dict) or not CKPT_KEYS <= set(ck):
        fail(f"--resume: {path} is not a train_gpu.py checkpoint (it lacks "
             f"{', '.join(sorted(CKPT_KEYS - set(ck) if isinstance(ck, dict) else CKPT_KEYS))})")
    if ck["model_config"] != model_config:
        fail(f"--resume: the checkpoint's model {ck['model_config']} differs from this run's {model_config}")
    return ck


def run_record(args, device, world: int, precision: str) -> dict:
    """What a run needs to be repeated and compared: written to OUT/run.json."""
    cuda = device.type == "cuda"
    commit, dirty = git_state()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        "args": vars(args),
        "git_commit": commit, "git_dirty": dirty,
        "device": torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine()),
        "device_type": device.type, "processes": world, "nodes": max(1, world // local), "host": platform.node(),
        "precision": precision,
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "start": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "end": None,
    }


def model_config(args) -> dict:
    return vars(GPTConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_layer=args.n_layer,
                          n_head=args.n_head, seq_len=args.seq_len))


def ledger_mib(args, n_params: int, world: int) -> float:
    """The memory ledger's peak per GPU for this run, in MiB: eager autograd, bf16 autocast over fp32
    weights, DDP (every GPU holds the whole state), the GPU kernels, checkpointing as asked."""
    shape = Shape(args.d_model, args.n_layer, args.n_head, args.seq_len, args.micro_batch, args.vocab_size)
    return step_bytes(shape, n_params, gpus=world, scheme="ddp", layout="autocast",
                      checkpoint=args.checkpoint_activations, kernels="gpu")["total"] / 2**20


def main(argv=None):
    args = build_parser().parse_args(argv)
    ranks = launch_ranks()
    accum = check_args(args, ranks.world)
    out = Path(args.out)
    problem = output_problem(out, "dir")
    if problem:
        fail(f"--out {problem}")
    ckpt = None
    if args.resume:
        if not (out / CKPT_NAME).is_file():
            fail(f"--resume: there is no checkpoint {CKPT_NAME} in {out}")
        ckpt = read_checkpoint(out / CKPT_NAME, model_config(args))
    elif (out / CKPT_NAME).exists():
        fail(f"{out}/{CKPT_NAME} exists; pass --resume to continue it or choose another --out")
    device = setup_device(args, ranks.local_rank)
    precision = resolve_precision(args.precision, device)
    data = TokenSource(args.data, args.vocab_size, args.seq_len, args.tokenizer)
    if ranks.rank == 0:
        for name in (CKPT_NAME, RECORD_NAME):  # what atomic_write leaves behind when a run is killed mid-write
            stale = out / (name + ".tmp")
            if stale.exists():
                stale.unlink()
                print(f"removed {stale.name}, a partial file left by an interrupted run")
    with process_group("nccl" if device.type == "cuda" else "gloo"):
        run(args, device, ranks, accum, precision, data, ckpt)


def run(args, device, ranks, accum: int, precision: str, data: TokenSource, ck: dict | None):
    """The training run itself, on this process's device, inside the process group."""
    rank, local_rank, world = ranks
    out = Path(args.out)
    ckpt_path = out / CKPT_NAME
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    cuda = device.type == "cuda"
    use_compile = cuda if args.compile is None else args.compile
    dtype = AUTOCAST[precision]

    def autocast():
        return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)

    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls left outside autocast use TF32
        torch.backends.cudnn.allow_tf32 = True

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    cfg = GPTConfig(**model_config(args))
    raw = GPT(cfg).to(device)  # fp32 master weights; autocast runs the matmuls in bf16 or fp16
    raw.checkpoint_blocks = args.checkpoint_activations  # set before compile and DDP wrap the model
    opt = configure_optimizer(raw, args.lr, args.weight_decay, fused=True if cuda else None)
    # fp16: scale the loss so small gradients do not underflow; a step with an inf gradient is skipped
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    gen = torch.Generator().manual_seed(args.seed + 1)  # the sampler: same stream on every rank
    start, skipped = 0, 0

    if ck is not None:
        try:
            raw.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            fail(f"--resume: {ckpt_path} does not fit this model and optimizer ({str(e).splitlines()[0]})")
        gen.set_state(ck["sampler_rng"])
        torch.set_rng_state(ck["cpu_rng"])
        if cuda and ck.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ck["cuda_rng"][local_rank % len(ck["cuda_rng"])])
        if scaler is not None and ck.get("scaler"):
            scaler.load_state_dict(ck["scaler"])
        start, skipped = ck["step"], ck.get("skipped_steps", 0)
        log(f"resumed from {CKPT_NAME} at step {start}")

    model = torch.compile(raw) if use_compile else raw
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local_rank] if cuda else None)

    n_params = raw.num_params()
    flops_tok = flops_per_token(cfg, n_params)
    peak, peak_note = peak_flops(device, args.peak_tflops)
    tokens_per_step = args.global_batch_tokens
    precision_note = {"bf16": "bf16 autocast, fp32 master weights", "fp32": "fp32",
                      "fp16": "fp16 autocast + GradScaler, fp32 master weights"}[precision]
    if cuda:
        precision_note += ", TF32"
    log(f"model {n_params:,} parameters | {world} process(es) on {device.type} | micro-batch {args.micro_batch} "
        f"× seq {args.seq_len} × {world} × accumulation {accum} = {tokens_per_step:,} tokens per step")
    log(f"data: {data.name}, {len(data):,} tokens; each step reads {tokens_per_step / len(data):.3g} "
        f"of it | tokenizer: {data.tokenizer_name} | precision: {precision_note} | "
        f"compile: {use_compile} | activation checkpointing: {'on' if args.checkpoint_activations else 'off'} | "
        f"{peak_note}")
    ledger = None  # the GPU path's prediction; the CPU runs other kernels (fp32, blocked loss)
    if cuda:
        ledger = ledger_mib(args, n_params, world)
        log(f"memory ledger (code/memory.py): {ledger:,.0f} MiB per GPU predicted for eager autograd; "
            f"torch.compile usually needs less")

    val_batches, byte_counts = None, None
    if args.eval_every:
        val_batches = [(x.to(device, torch.int64), y.to(device, torch.int64))
                       for x, y in fixed_batches(data.val, args.eval_batches, args.micro_batch, args.seq_len)]
        if data.tokenizer is not None:
            byte_counts = token_bytes(data.tokenizer).to(device)

    def validate():
        """(validation loss, bits per byte or None): the same fixed batches on every rank."""
        with autocast():
            if byte_counts is None:
                return evaluate(raw, val_batches), None
            return bits_per_byte(raw, val_batches, byte_counts)

    def batch():
        # one global micro-batch from the shared generator; this rank keeps its rows
        x, y = get_batch(data.train, args.micro_batch * world, args.seq_len, gen)
        rows = slice(rank * args.micro_batch, (rank + 1) * args.micro_batch)
        x, y = x[rows].to(torch.int64), y[rows].to(torch.int64)
        if cuda:  # pinned host memory lets the copy run asynchronously with compute
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    def checkpoint(step):
        if master:
            save_atomic({
                "model": raw.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "model_config": vars(cfg), "args": vars(args), "world_size": world,
                "sampler_rng": gen.get_state(), "cpu_rng": torch.get_rng_state(),
                "cuda_rng": [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())] if cuda else None,
                "scaler": scaler.state_dict() if scaler is not None else None, "skipped_steps": skipped,
            }, ckpt_path)
        if world > 1:
            dist.barrier()

    def all_finite(loss_sum, norm) -> bool:
        bad = (~torch.isfinite(loss_sum) | ~torch.isfinite(norm)).float()
        if world > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # every rank takes the same decision
        return bad.item() == 0

    out.mkdir(parents=True, exist_ok=True)
    record = None
    if master:
        record = run_record(args, device, world, precision)
        earlier = []
        if start and (out / RECORD_NAME).is_file():  # keep what the interrupted runs recorded
            import json
            try:
                old = json.loads((out / RECORD_NAME).read_text(encoding="utf-8"))
                earlier = old.pop("earlier_runs", []) + [old]
            except (OSError, ValueError):
                pass
        record.update(resumed_from_step=start or None, earlier_runs=earlier)
        write_json(out / RECORD_NAME, record)
        keep_log_lines(out / LOG_NAME, start)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    loss_sum = torch.zeros((), device=device)  # summed on the device: no .item() sync every step
    t_last, steps_since = time.perf_counter(), 0
    for step in range(start, args.steps):
        lr = lr_at(step, args.lr, args.warmup, args.steps, args.min_lr_ratio)
        set_lr(opt, lr)
        forward = model if scaler is None else ScaledLoss(model, scaler)
        # all-reduce the gradients once, after the last micro-batch: the big batch's mean gradient
        loss = accumulate_gradients(forward, [batch() for _ in range(accum)],
                                    no_sync=model.no_sync if world > 1 else None, autocast_dtype=dtype)
        if args.inject_inf_grad_at == step + 1:
            next(raw.parameters()).grad.view(-1)[0] = float("inf")  # what an fp16 overflow leaves
        if scaler is not None:
            loss = forward.mean_loss()  # the loss before scaling
            scaler.unscale_(opt)  # true gradients, for clipping; inf/NaN here makes scaler.step skip
        if args.inject_nan_at is not None and step + 1 >= args.inject_nan_at:
            loss = loss * float("nan")  # what a diverging run shows
        loss_sum += loss
        norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), args.grad_clip if args.grad_clip else float("inf"))
        steps_since += 1
        done = step + 1
        log_now = done % args.log_every == 0 or done == args.steps
        eval_now = bool(args.eval_every) and (done % args.eval_every == 0 or done == args.steps)
        save_now = done == args.steps or (args.save_every and done % args.save_every == 0)
        # fp16: an inf gradient is the GradScaler's business (it skips the step); only the loss is checked
        guard_norm = norm if scaler is None else torch.zeros((), device=device)
        if (log_now or save_now) and not all_finite(loss_sum, guard_norm):
            # nothing is stepped or saved: the last checkpoint on disk is the last good state
            log(f"error: the loss or gradient became NaN/inf at or before step {done}; stopping. The last good "
                f"checkpoint is {out / CKPT_NAME} (if one was saved); lower --lr or check the data, then --resume")
            sys.exit(3)  # process_group() leaves the group on the way out
        if scaler is None:
            opt.step()
        else:
            scale = scaler.get_scale()
            scaler.step(opt)  # skipped if the unscaled gradients hold an inf or NaN
            scaler.update()  # then the scale halves; it doubles after 2000 good steps
            skipped += scaler.get_scale() < scale
        opt.zero_grad(set_to_none=True)
        if log_now or eval_now:
            # .item() also waits for the GPU: the clock below is honest
            dt = time.perf_counter() - t_last
            t_eval = time.perf_counter()
            val_loss, val_bpb = validate() if eval_now else (None, None)
            t_eval = time.perf_counter() - t_eval
        if log_now:
            mean_loss = mean_across_ranks(loss_sum / steps_since).item()
            tok_s = tokens_per_step * steps_since / dt
            mfu = None if peak is None else flops_tok * tok_s / (peak * world)
            peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
            line = (f"step {done:5d}/{args.steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                    f"{tok_s:,.0f} tokens/s | {1000 * dt / steps_since:.1f} ms/step")
            if mfu is not None:
                line += f" | MFU {100 * mfu:.1f}%"
            if cuda:
                line += f" | peak mem {peak_mib:,.0f} MiB (ledger {ledger:,.0f} MiB)"
            if scaler is not None:
                line += f" | fp16 steps skipped {skipped}"
            log(line)
            if master:
                append_jsonl(out / LOG_NAME, {
                    "step": done, "train_loss": mean_loss, "val_loss": val_loss, "val_bpb": val_bpb, "lr": lr,
                    "tokens_per_s": tok_s, "mfu": mfu, "peak_mem_mib": peak_mib, "skipped_steps": skipped,
                    "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
            loss_sum.zero_()
            t_last, steps_since = time.perf_counter(), 0
        if eval_now:
            log(f"step {done:5d}/{args.steps} | val loss {val_loss:.4f}"
                + ("" if val_bpb is None else f" | val bits per byte {val_bpb:.4f}"))
            t_last += t_eval  # evaluating is not training: keep it out of tokens/s
        if save_now:
            t_save = time.perf_counter()
            checkpoint(done)
            t_last += time.perf_counter() - t_save  # saving is not training: keep it out of tokens/s
    if cuda:
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
        log(f"memory: peak allocated {peak_mib:,.0f} MiB, ledger {ledger:,.0f} MiB, ratio {peak_mib / ledger:.2f}")
    if master and args.sample_tokens:
        log(sample_text(raw, data.tokenizer, args, device, autocast))
    if master:
        record["end"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        write_json(out / RECORD_NAME, record)
    log(f"done: {args.steps} steps; last checkpoint {CKPT_NAME}, {RECORD_NAME} and {LOG_NAME} in --out")


def keep_log_lines(path: Path, last_step: int) -> None:
    """Keep the log lines of steps up to last_step (where a resumed run continues), atomically:
    lines a killed run wrote after its last checkpoint are logged again by the resumed run."""
    import json
    kept = []
    if last_step and path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line)["step"] <= last_step:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                break  # a line cut by the kill: nothing after it is whole
    with atomic_write(path) as f:
        f.write("".join(kept).encode("utf-8"))


def sample_text(model, sp, args, device, autocast) -> str:
    """A line with ~args.sample_tokens tokens generated from the start of a document."""
    if sp is None:
        return "sample: skipped, the tokenizer of --data is unknown (pass --tokenizer)"
    g = torch.Generator().manual_seed(args.seed)
    start = torch.tensor([[sp.eos_id()]], device=device)  # eos ends a document: what follows starts one
    with autocast():
        ids = generate(model, start, args.sample_tokens, temperature=0.8, generator=g, context=args.seq_len)
    ids = [i for i in ids[0, 1:].tolist() if i < sp.get_piece_size()]  # ids beyond the tokenizer: never trained
    docs, cur = [], []
    for i in ids:
        if i == sp.eos_id():
            docs.append(sp.decode(cur))
            cur = []
        else:
            cur.append(i)
    docs.append(sp.decode(cur))
    return f"sample ({args.sample_tokens} tokens, temperature 0.8, ⏎ = end of document): " + " ⏎ ".join(docs)


if __name__ == "__main__":
    main()
