"""Train the book's GPT on one or several GPUs, replicated (DDP) or sharded (FSDP2).

    python code/train_gpu.py                                         # 1 GPU
    torchrun --standalone --nproc-per-node 8 code/train_gpu.py       # 8 GPUs, DDP
    torchrun --standalone --nproc-per-node 8 code/train_gpu.py --shard fsdp   # 8 GPUs, sharded (ZeRO-3)
    python code/train_gpu.py --device cpu --d-model 64 --n-layer 2 --n-head 2 --seq-len 64 \\
        --micro-batch 4 --global-batch-tokens 1024 --steps 20 --log-every 5 --out /tmp/smoke   # on a CPU

    # two machines (run on each; see launch/ for Slurm and SkyPilot):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id RUN code/train_gpu.py

`python code/budget.py ...` prints the exact command for the scheme and micro-batch it recommends.

Global batch: --global-batch-tokens is the number of tokens in one optimizer step, whatever the number
of processes; gradient accumulation = global batch / (micro-batch · seq-len · processes) is derived
from it. Every process draws the same start positions of the step's sequences from one seeded
generator and reads only its own rows, so 1, 2 or 4 processes see the same data and end with the same
parameters (up to the order of floating-point sums).

Sharding (--shard):
  ddp   every GPU holds the whole model, gradients and AdamW state (16 bytes per parameter); one
        all-reduce of the gradients per step, skipped on all but the last micro-batch.
  fsdp  FSDP2 (fully_shard) per block, then the root, which holds the tied embedding/head and the
        final norm (one matrix cannot belong to two groups, so the embedding and the head are not
        groups of their own as in torchtitan). Weights, gradients and optimizer state are shards.
        --reshard-after-forward (default): ZeRO-3, the weights are freed after forward and gathered
        again for backward: per micro-batch two all-gathers of the weights and one reduce-scatter of
        the gradients. --no-reshard-after-forward: the gathered weights stay from forward to backward,
        one all-gather less per micro-batch for the memory of one whole copy of the weights during
        the step: between ZeRO-2 and ZeRO-3 (the ledger counts it as ZeRO-2). Under accumulation the
        reduce-scatter is skipped on all but the last micro-batch (set_requires_gradient_sync), so
        the gradients are whole (4 bytes per parameter) until the step's last backward.
        The model is built on the meta device, sharded, then materialised and initialised one
        parameter at a time (model.init_per_parameter): no process ever holds the whole model, and
        the result equals the same seed's unsharded model. With one process --shard fsdp has
        nothing to shard: it trains the plain model, as --shard ddp does.
  ZeRO-1 (only the optimizer state sharded) is not implemented; --shard fsdp --no-reshard-after-forward
  comes closest.

Precision (--precision auto): bf16 where the GPU has it (Ampere and later), else fp16 with a GradScaler
(a step whose gradients overflowed is skipped and counted; under FSDP the overflow flag is all-reduced);
fp32 on a CPU. DDP: autocast over fp32 weights. FSDP: MixedPrecisionPolicy(param_dtype=bf16 or fp16,
reduce_dtype=fp32) over fp32 sharded weights, without autocast. On CUDA also TF32, torch.compile (of
each block under FSDP), fused AdamW and pinned host memory. MFU is measured against the dense peak of
the GPU looked up by name and SM count (code/gpus.py). --checkpoint-activations recomputes each block
during backward: less activation memory for about one more forward pass, the same parameters.

Memory: at start the log prints what the memory ledger (code/memory.py) predicts per device for the
scheme this run uses; on CUDA each log line puts torch's peak allocation beside it. After the first
step it prints the bytes of parameters, gradients and optimizer state this process holds, counted
from its tensors' local shards.

Data: the book's tokens (default) or --data PATH, a flat file of uint16 token ids (code/prepare_tokens.py),
read through np.memmap. Evaluation (--eval-every N): validation loss and bits per byte on fixed held-out
batches (the book's val split, or the last 5% of a --data file). At the end rank 0 prints a sample.

Checkpoints: OUT/checkpoints/step_NNNNNNNN/, written by every process with torch.distributed.checkpoint
(each its shards), holding the model, the AdamW state, the sampler's and the CPU's RNG state and the
GradScaler's scale, and train_state.json (step, model shape, scheme). DCP writes .metadata last: a folder
without it is a save that was cut, ignored and removed on the next start, so a run killed at any moment
leaves the previous checkpoint usable. After each complete save the older ones are removed. --resume
continues from the newest complete checkpoint on any number of processes and under either scheme (DCP
reshards); --auto-resume does so if there is one and starts afresh if not (what launch/ uses). A load
never unpickles code: the metadata with an allowlist of DCP's own classes, the tensors and values with
torch.load(weights_only=True). OUT/model.pt: the final weights as one plain state_dict
(torch.load(..., weights_only=True)), written at the end and on preemption.

Preemption: on SIGTERM or SIGUSR1 (what Slurm's --signal sends) every process finishes its step, the
processes agree at the step boundary (one all-reduce of a stop flag), save a checkpoint, and exit with
status 75 (EXIT_PREEMPTED); torchrun then exits non-zero, so rank 0 also records the status in
OUT/run.json ("exit_code"), where launch/slurm.sbatch reads it to requeue the job.

Exit status: 0 done; 1 a bad file or setting found before training (one line on stderr); 2 a bad
command-line argument; 3 the loss or a gradient became NaN/inf (nothing saved after the last good
checkpoint); 4 a collective waited longer than --timeout-s for another process (which died or hung);
75 stopped by SIGTERM/SIGUSR1 after saving a checkpoint (resume with --resume).

Run log (rank 0): OUT/run.json (command line, arguments, git commit, devices, versions, start, end, exit
code; rewritten atomically) and OUT/log.jsonl (one JSON line per log step, fsynced).
"""
import argparse
import contextlib
import datetime
import json
import os
import pickle
import platform
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import (  # noqa: E402,E501
    fixed_batches,
    get_batch,
    load_tokenizer,
    load_tokens_or_exit,
    token_bytes,
    tokenizer_path_for,
)
from gpus import describe_peak  # noqa: E402
from measure import git_state  # noqa: E402
from memory import SCHEME_NAMES, Shape, state_bytes, step_bytes  # noqa: E402
from model import GPT, GPTConfig, init_per_parameter  # noqa: E402
from script_support import (  # noqa: E402
    REFUSED,
    Parser,
    ScaledLoss,
    accumulate_gradients,
    append_jsonl,
    atomic_write,
    fail,
    generate,
    launch_ranks,
    mean_across_ranks,
    output_problem,
    process_group,
    save_atomic,
    set_lr,
    write_json,
)
from shapes import flops_per_token  # noqa: E402
from train import bits_per_byte, configure_optimizer, evaluate, lr_at  # noqa: E402

CKPT_DIR = "checkpoints"
STATE_NAME = "train_state.json"
EXPORT_NAME = "model.pt"
LOG_NAME = "log.jsonl"
RECORD_NAME = "run.json"
HOLDOUT = 0.05  # the last 5% of a --data file is validation
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
EXIT_NAN, EXIT_TIMEOUT, EXIT_PREEMPTED = 3, 4, 75  # 75: EX_TEMPFAIL, "try again"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
COLLECTIVE_WORDS = ("gloo", "NCCL", "Timed out", "timed out", "Connection closed")  # a failed collective's words
DEFAULT_GLOBAL_BATCH_TOKENS = 2**19  # 524,288 tokens per step, GPT-3 Small's 0.5M


def refuse(message: str) -> NoReturn:
    """A bad file, setting or checkpoint: one line on stderr and exit status 1 (a bad argument is argparse's 2)."""
    fail(message, REFUSED)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="train_gpu.py", description="Train the book's GPT on 1..N GPUs (or a CPU, as a smoke test), "
               "replicated (DDP) or sharded (FSDP2). Exit status: 0 done, 1 bad file or setting, 2 bad argument, "
               f"3 NaN/inf, 4 a process timed out, {EXIT_PREEMPTED} stopped by SIGTERM/SIGUSR1 after saving "
               "a checkpoint (resume with --resume).")
    a = p.add_argument
    a("--d-model", type=int, default=512)
    a("--n-layer", type=int, default=8)
    a("--n-head", type=int, default=8)
    a("--seq-len", type=int, default=512)
    a("--vocab-size", type=int, default=8192)
    a("--micro-batch", type=int, default=32, help="sequences per process per forward pass")
    a("--global-batch-tokens", type=int, default=DEFAULT_GLOBAL_BATCH_TOKENS,
      help="tokens per optimizer step over all processes, the same for any number of processes; "
           "accumulation steps are derived from it (default %(default)s)")
    a("--shard", choices=("ddp", "fsdp"), default="ddp",
      help="ddp: every GPU holds the whole model; fsdp: weights, gradients and optimizer state sharded (FSDP2)")
    a("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
      help="with --shard fsdp: free the gathered weights after forward (ZeRO-3, default) or keep them "
           "until backward (--no-...: one all-gather less per micro-batch, more memory; ZeRO-2 in the ledger)")
    a("--steps", type=int, default=2000)
    a("--lr", type=float, default=1e-3)
    a("--warmup", type=int, default=100)
    a("--min-lr-ratio", type=float, default=0.1)
    a("--weight-decay", type=float, default=0.1)
    a("--grad-clip", type=float, default=1.0, help="clip the gradients' global norm to this (0: no clipping)")
    a("--seed", type=int, default=0)
    a("--data", default=None, help="uint16 token file (code/prepare_tokens.py); default: the book's tokens. "
      "Its last 5%% is held out for validation and never trained on")
    a("--tokenizer", default=None, help="SentencePiece model of --data, for bits per byte and the sample "
      "(default: the book's, or DATA's .tokenizer.model written by prepare_tokens.py)")
    a("--out", default="out_gpu", help="folder for checkpoints, model.pt, run.json and log.jsonl")
    a("--save-every", type=int, default=500, help="steps between checkpoints (0: only at the end)")
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue from the newest complete checkpoint in --out, on any number of processes")
    resume.add_argument("--auto-resume", action="store_true",
                        help="as --resume if --out holds a complete checkpoint, else start afresh (for requeued jobs)")
    a("--timeout-s", type=float, default=600,
      help="seconds a collective waits for the other processes before the run stops with exit status 4")
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
    a("--test-faults", default=None, help=argparse.SUPPRESS)  # tests only: see Faults at the end of the file
    return p


def check_args(args, world: int) -> int:
    """Validate settings (exit 2 with one line); return the number of accumulation steps."""
    p = build_parser()
    for name in ("d_model", "n_layer", "n_head", "seq_len", "vocab_size", "micro_batch", "steps", "log_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.d_model % args.n_head or (args.d_model // args.n_head) % 2:
        p.error(f"--d-model {args.d_model} must split into --n-head {args.n_head} heads of even size (RoPE)")
    if args.save_every < 0 or args.warmup < 0 or not args.lr > 0 or args.grad_clip < 0:
        p.error("--save-every, --warmup and --grad-clip must be >= 0 and --lr > 0")
    if args.eval_every < 0 or args.eval_batches <= 0 or args.sample_tokens < 0:
        p.error("--eval-every and --sample-tokens must be >= 0 and --eval-batches > 0")
    if not args.timeout_s > 0:
        p.error(f"--timeout-s must be positive, got {args.timeout_s:g}")
    if args.vocab_size > 65536 and args.data:
        p.error("uint16 token files hold ids below 65,536; --vocab-size is larger")
    per_micro = args.micro_batch * args.seq_len * world
    if args.global_batch_tokens <= 0 or args.global_batch_tokens % per_micro:
        p.error(f"--global-batch-tokens {args.global_batch_tokens:,} is not a positive multiple of micro-batch × "
                f"seq-len × processes = {args.micro_batch} × {args.seq_len} × {world} = {per_micro:,}; "
                f"use e.g. {per_micro * max(1, round(args.global_batch_tokens / per_micro)):,}")
    if args.test_faults is not None:
        Faults.parse(args.test_faults, p)
    return args.global_batch_tokens // per_micro


# ---- setup: device, data, model --------------------------------------------------------------------

def setup_device(args, local_rank: int) -> torch.device:
    """The device this process trains on: GPU number local_rank, or the CPU."""
    if args.device == "cuda":
        if not torch.cuda.is_available():
            refuse("--device cuda was asked for, but this machine has no CUDA GPU that torch can use; "
                 "for a smoke test on the CPU add --device cpu and a tiny config")
        if local_rank >= torch.cuda.device_count():
            refuse(f"process {local_rank} needs GPU {local_rank}, but only {torch.cuda.device_count()} are visible")
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
            book = load_tokens_or_exit()
            self.train, self.val = book.train, book.val
            self.name = "the book's 全宋词 tokens"
            default_tok = "book"
        else:
            path = Path(path)
            if not path.is_file():
                refuse(f"--data {path} does not exist or is not a file (make one with code/prepare_tokens.py)")
            size = path.stat().st_size
            if size % 2 or size == 0:
                refuse(f"--data {path.name} is not a uint16 token file (its size is odd or zero)")
            if size // 2 < need:
                refuse(f"--data {path.name} holds {size // 2:,} tokens, fewer than one sequence "
                     f"(--seq-len {seq_len} + 2); use a longer file or a shorter --seq-len")
            # copy-on-write: a writable view for torch that never writes back to the file
            arr = np.memmap(path, dtype=np.uint16, mode="c")
            top = max(int(arr[i:i + (1 << 26)].max()) for i in range(0, len(arr), 1 << 26))
            if top >= vocab_size:
                refuse(f"--data {path.name} holds token id {top}, beyond --vocab-size {vocab_size}")
            tokens = torch.from_numpy(arr)
            n_val = int(len(tokens) * HOLDOUT)
            if n_val < need or len(tokens) - n_val < need:
                refuse(f"--data {path.name} holds {len(tokens):,} tokens: its last 5% ({n_val:,}) held out for "
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
            refuse(f"--tokenizer {path} does not exist")
        try:
            sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError):
            refuse(f"--tokenizer {path.name} is not a SentencePiece model")
        if sp.get_piece_size() > vocab_size:
            refuse(f"--tokenizer {path.name} has {sp.get_piece_size():,} ids, more than --vocab-size {vocab_size:,}")
        return sp, path.name

    def __len__(self):
        return len(self.train)


class Sampler:
    """The step's global batch of --global-batch-tokens: every process draws all its start positions
    from one generator (the same on every process, whatever their number) and reads only its own
    rows, cut into micro-batches. Its state is the generator's: saved and restored with a checkpoint."""

    def __init__(self, tokens, args, rank: int, world: int, device):
        self.tokens, self.seq_len, self.micro, self.device = tokens, args.seq_len, args.micro_batch, device
        self.sequences = args.global_batch_tokens // args.seq_len  # per step, over all processes
        per_rank = self.sequences // world
        self.rows = slice(rank * per_rank, (rank + 1) * per_rank)
        self.gen = torch.Generator().manual_seed(args.seed + 1)

    def step_batches(self) -> list:
        x, y = get_batch(self.tokens, self.sequences, self.seq_len, self.gen, rows=self.rows)
        x, y = x.to(torch.int64), y.to(torch.int64)
        if self.device.type == "cuda":  # pinned host memory lets the copy run asynchronously with compute
            x, y = (t.pin_memory().to(self.device, non_blocking=True) for t in (x, y))
        return list(zip(x.split(self.micro), y.split(self.micro)))


@dataclass
class Trainer:
    """What the loop needs: the model as wrapped for this scheme, its plain module, the optimizer."""
    args: argparse.Namespace
    device: torch.device
    rank: int
    world: int
    accum: int
    precision: str
    sharded: bool  # FSDP over more than one process
    model: torch.nn.Module  # what forward runs: plain, compiled, DDP- or FSDP-wrapped
    raw: GPT  # the GPT module itself (under FSDP its parameters are DTensor shards)
    opt: torch.optim.Optimizer
    scaler: "torch.amp.GradScaler | None"
    sampler: Sampler
    autocast_dtype: "torch.dtype | None"  # DDP: autocast; FSDP: None (its policy casts)
    faults: "Faults"
    compiled: bool
    skipped: int = 0  # fp16 steps skipped for an overflow

    @property
    def ledger_scheme(self) -> str:
        if not self.sharded:
            return "ddp"
        return "zero3" if self.args.reshard_after_forward else "zero2"


def shard(model: GPT, args, device, precision: str) -> None:
    """FSDP2 per block, then the root (the tied embedding/head and the final norm)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    dtype = DTYPES[precision]
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=args.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=args.reshard_after_forward)


def setup(args, device, rank: int, world: int, accum: int, precision: str, data: TokenSource) -> Trainer:
    """Build, shard and initialise the model; the optimizer, the loss scaler and the sampler."""
    cuda = device.type == "cuda"
    use_compile = cuda if args.compile is None else args.compile
    sharded = args.shard == "fsdp" and world > 1
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls left outside autocast use TF32
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    # sharded: shapes only (meta), so no process ever holds the whole model; materialised after sharding
    with torch.device("meta" if sharded else device):
        raw = GPT(GPTConfig(**model_config(args)))
    raw.checkpoint_blocks = args.checkpoint_activations  # set before compile and the wrappers
    if sharded:
        if use_compile:
            for block in raw.blocks:  # compiled per block, before sharding, as torchtitan does
                block.compile()
        shard(raw, args, device, precision)
        raw.to_empty(device=device)  # (on a plain model to_empty would untie the embedding and the head)
    init_per_parameter(raw, args.seed)  # the same initial weights, sharded or not
    model = raw
    if not sharded:
        model = torch.compile(raw) if use_compile else raw
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[device.index] if cuda else None)
    opt = configure_optimizer(raw, args.lr, args.weight_decay, fused=True if cuda else None)
    # fp16: scale the loss so small gradients do not underflow; a step with an inf gradient is skipped
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    return Trainer(args=args, device=device, rank=rank, world=world, accum=accum, precision=precision,
                   sharded=sharded, model=model, raw=raw, opt=opt, scaler=scaler,
                   sampler=Sampler(data.train, args, rank, world, device),
                   autocast_dtype=None if sharded else DTYPES[precision], faults=Faults.parse(args.test_faults),
                   compiled=use_compile)


# ---- one optimizer step ----------------------------------------------------------------------------

def no_sync(t: Trainer):
    """The context that skips the gradient reduction of a micro-batch that is not the step's last."""
    if t.world == 1:
        return None
    if t.sharded:
        @contextlib.contextmanager
        def fsdp_no_sync():  # gradients stay whole and accumulate; the last backward reduce-scatters
            t.model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                t.model.set_requires_gradient_sync(True)
        return fsdp_no_sync
    return t.model.no_sync


def train_step(t: Trainer, step: int) -> tuple:
    """Forward and backward over the step's micro-batches, clip, step AdamW. Returns (mean loss,
    gradient norm), both tensors on the device, not yet synchronised."""
    set_lr(t.opt, lr_at(step, t.args.lr, t.args.warmup, t.args.steps, t.args.min_lr_ratio))
    forward = t.model if t.scaler is None else ScaledLoss(t.model, t.scaler)
    loss = accumulate_gradients(forward, t.sampler.step_batches(), no_sync=no_sync(t),
                                autocast_dtype=t.autocast_dtype)
    t.faults.after_backward(t, step)
    if t.scaler is not None:
        loss = forward.mean_loss()  # the loss before scaling
        t.scaler.unscale_(t.opt)  # true gradients, for clipping; inf/NaN here makes scaler.step skip
        if t.sharded:  # each process saw only its shards: skip the step everywhere or nowhere
            for found in t.scaler._per_optimizer_states[id(t.opt)]["found_inf_per_device"].values():
                dist.all_reduce(found, op=dist.ReduceOp.MAX)
    loss = t.faults.loss(loss, step)
    clip = t.args.grad_clip if t.args.grad_clip else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(t.raw.parameters(), clip)  # on shards: the norm is reduced
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP
        norm = norm.full_tensor()
    if t.scaler is not None:
        norm = torch.zeros((), device=t.device)  # an inf gradient is the GradScaler's business
    return loss, norm


def optimizer_step(t: Trainer) -> None:
    if t.scaler is None:
        t.opt.step()
    else:
        scale = t.scaler.get_scale()
        t.scaler.step(t.opt)  # skipped if the unscaled gradients hold an inf or NaN
        t.scaler.update()  # then the scale halves; it doubles after 2000 good steps
        t.skipped += t.scaler.get_scale() < scale
    t.opt.zero_grad(set_to_none=True)


def any_rank(value, device) -> int:
    """The largest of `value` (a bool or an int) over all processes: one all-reduce, so every process
    takes the same decision."""
    x = torch.tensor(int(value), device=device)
    if dist.is_initialized():
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return int(x.item())


# ---- checkpoints (torch.distributed.checkpoint: every process writes its shards) ----------------------

def step_dir(out: Path, step: int) -> Path:
    return out / CKPT_DIR / f"step_{step:08d}"


def complete_checkpoints(out: Path) -> list:
    """The checkpoint folders whose save finished (DCP writes .metadata last), oldest first."""
    root = out / CKPT_DIR
    if not root.is_dir():
        return []
    return sorted(d for d in root.glob("step_*") if (d / ".metadata").is_file() and (d / STATE_NAME).is_file())


def checkpoint_state(t: Trainer) -> dict:
    """What a checkpoint holds, as tensors (DCP reshards those): model and optimizer by parameter name,
    the sampler's and the CPU's RNG state, the loss scale."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(t.model, t.opt)
    model_sd.pop("lm_head.weight", None)  # tied to tok_emb.weight: the same matrix, saved once
    state = {"model": model_sd, "optim": optim_sd, "sampler_rng": t.sampler.gen.get_state(),
             "cpu_rng": torch.get_rng_state()}
    if t.scaler is not None:
        state["scaler"] = {"scale": torch.tensor(t.scaler.get_scale()),
                           "growth_tracker": torch.tensor(t.scaler._get_growth_tracker())}
    return state


def save_checkpoint(t: Trainer, step: int) -> Path:
    """Save a complete checkpoint of `step`, then remove the older ones. A kill at any moment leaves
    the previous complete checkpoint where it was."""
    import torch.distributed.checkpoint as dcp
    out = Path(t.args.out)
    path = step_dir(out, step)
    if t.rank == 0:
        shutil.rmtree(path, ignore_errors=True)  # a cut save of this very step, from an earlier run
        path.mkdir(parents=True)
        write_json(path / STATE_NAME, {"step": step, "model_config": model_config(t.args), "world_size": t.world,
                                       "shard": "fsdp" if t.sharded else "ddp", "skipped_steps": t.skipped})
    if t.world > 1:
        dist.barrier()
    with single_process_quiet():
        dcp.save(checkpoint_state(t), checkpoint_id=path, no_dist=t.world == 1)  # .metadata last: complete
    if t.world > 1:
        dist.barrier()
    if t.rank == 0:
        for old in (out / CKPT_DIR).glob("step_*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
    return path


@contextlib.contextmanager
def single_process_quiet():
    """DCP warns that it 'assumes a single process' when there is no process group: that is the intent."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class _SafeMetadataUnpickler(pickle.Unpickler):
    """DCP's .metadata is a pickle; this reads it allowing only DCP's own record classes and the few
    plain types they hold, so a crafted .metadata cannot run code."""
    ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                       "torch.distributed.checkpoint.planner")
    ALLOWED = {("collections", "OrderedDict"), ("torch", "Size"), ("copyreg", "_reconstructor"),
               ("builtins", "object"), ("builtins", "set"), ("builtins", "frozenset"),
               ("torch", "device"), ("torch.serialization", "_get_layout"),  # a layout's name -> the layout
               ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}  # where the checkpoint was saved

    def find_class(self, module, name):
        if module in self.ALLOWED_MODULES or (module, name) in self.ALLOWED or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")


def _safe_reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *a, **k):
            with open(Path(self.path) / ".metadata", "rb") as f:
                metadata = _SafeMetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata
    return SafeReader(path)


def _safe_planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        """Non-tensor values (the optimizer's hyperparameters) with torch.load(weights_only=True)."""

        def load_bytes(self, read_item, value):
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._nested_dict import set_element
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj
    return SafePlanner()


def check_checkpoint(path: Path, config: dict) -> dict:
    """The train_state.json of the checkpoint folder `path` after checking that it belongs to this
    model and that every file its metadata names is there and long enough; one line and exit 1 if not."""
    try:
        state = json.loads((path / STATE_NAME).read_text(encoding="utf-8"))
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError):
        refuse(f"--resume: {path.name}/{STATE_NAME} is not a train_gpu.py training state")
    if state.get("model_config") != config:
        refuse(f"--resume: the checkpoint's model {state.get('model_config')} differs from this run's {config}")
    try:
        metadata = _safe_reader(path).read_metadata()
        files = {}
        for info in metadata.storage_data.values():
            files[info.relative_path] = max(files.get(info.relative_path, 0), info.offset + info.length)
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, OSError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        refuse(f"--resume: {path.name}/.metadata cannot be read safely ({why}); "
               "it is damaged or was not written by torch.distributed.checkpoint")
    for name, size in sorted(files.items()):
        f = path / name
        if not f.is_file() or f.stat().st_size < size:
            refuse(f"--resume: shard file {path.name}/{name} is {'missing' if not f.is_file() else 'truncated'}; "
                 "the checkpoint cannot be loaded (an earlier one was removed when it completed)")
    state["step"] = step
    return state


def load_checkpoint(t: Trainer, path: Path, state: dict) -> int:
    """Load a checkpoint saved on any number of processes under either scheme; return its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
    target = checkpoint_state(t)  # the shapes to load into, sharded as this run shards
    try:
        with single_process_quiet():
            dcp.load(target, checkpoint_id=path, storage_reader=_safe_reader(path), planner=_safe_planner(),
                     no_dist=t.world == 1)
        # strict=False: only lm_head.weight is absent, and it is tok_emb.weight (tied)
        set_state_dict(t.model, t.opt, model_state_dict=target["model"], optim_state_dict=target["optim"],
                       options=StateDictOptions(strict=False))
    except Exception as e:  # DCP wraps a rank's failure in CheckpointException; all mean the same here
        refuse(f"--resume: {path.name} does not fit this model and optimizer "
             f"({(str(e).strip().splitlines() or [type(e).__name__])[-1][:200]})")
    t.sampler.gen.set_state(target["sampler_rng"])
    torch.set_rng_state(target["cpu_rng"])
    if t.scaler is not None and "scaler" in target:
        t.scaler.update(float(target["scaler"]["scale"]))
        t.scaler._growth_tracker.fill_(int(target["scaler"]["growth_tracker"]))
    t.skipped = int(state.get("skipped_steps", 0))
    return state["step"]


def export_weights(t: Trainer) -> None:
    """OUT/model.pt: the whole model as one plain state_dict on rank 0 (gathered from the shards)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )
    sd = get_model_state_dict(t.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if t.rank == 0:
        save_atomic(sd, Path(t.args.out) / EXPORT_NAME)  # GPT(cfg).load_state_dict(torch.load(...)) takes it


# ---- logging -----------------------------------------------------------------------------------------

def model_config(args) -> dict:
    return vars(GPTConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_layer=args.n_layer,
                          n_head=args.n_head, seq_len=args.seq_len))


def ledger_mib(args, n_params: int, world: int, scheme: str = "ddp", accum: int = 1) -> float:
    """The memory ledger's peak per GPU for this run, in MiB: eager autograd, bf16 autocast over fp32
    weights, the scheme's sharding of the state, the GPU kernels, checkpointing as asked. Sharded with
    accumulation, the gradients are whole until the last micro-batch (see no_sync): that is added."""
    shape = Shape(args.d_model, args.n_layer, args.n_head, args.seq_len, args.micro_batch, args.vocab_size)
    parts = step_bytes(shape, n_params, gpus=world, scheme=scheme, layout="autocast",
                       checkpoint=args.checkpoint_activations, kernels="gpu")
    whole_grads = state_bytes(n_params, 1, "ddp")["grads"]
    extra = whole_grads - parts["grads"] if scheme != "ddp" and accum > 1 else 0
    return (parts["total"] + extra) / 2**20


def ledger_state_mib(t: Trainer) -> float:
    """What the ledger says one process holds of weights, gradients and optimizer state (fp32 here)."""
    return sum(state_bytes(t.raw.num_params(), t.world, t.ledger_scheme).values()) / 2**20


def held_bytes(t: Trainer) -> dict:
    """Bytes of parameters, gradients and optimizer state this process holds: its local shards."""
    def local(x):
        x = x.to_local() if hasattr(x, "to_local") else x
        return x.numel() * x.element_size()
    params = list(t.raw.parameters())
    return {"weights": sum(local(p) for p in params),
            "grads": sum(local(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(local(v) for st in t.opt.state.values() for v in st.values()
                             if torch.is_tensor(v) and v.dim() > 0)}


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
        refuse(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 tensor cores; use fp16 or auto")
    return choice


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
        "exit_code": None,
    }


class RunLog:
    """Rank 0's record of the run: the console, OUT/run.json and OUT/log.jsonl; silent on other ranks."""

    def __init__(self, t: Trainer, start: int):
        self.t, self.out, self.master = t, Path(t.args.out), t.rank == 0
        self.record = None
        if self.master:
            self.record = run_record(t.args, t.device, t.world, t.precision)
            earlier = []
            if start and (self.out / RECORD_NAME).is_file():  # keep what the interrupted runs recorded
                try:
                    old = json.loads((self.out / RECORD_NAME).read_text(encoding="utf-8"))
                    earlier = old.pop("earlier_runs", []) + [old]
                except (OSError, ValueError):
                    pass
            self.record.update(resumed_from_step=start or None, earlier_runs=earlier)
            write_json(self.out / RECORD_NAME, self.record)
            keep_log_lines(self.out / LOG_NAME, start)

    def __call__(self, *a):
        if self.master:
            print(*a, flush=True)

    def jsonl(self, entry: dict) -> None:
        if self.master:
            append_jsonl(self.out / LOG_NAME, {**entry, "time": now()})

    def end(self, exit_code: int) -> None:
        if self.master:
            self.record.update(end=now(), exit_code=exit_code)
            write_json(self.out / RECORD_NAME, self.record)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def describe_run(t: Trainer, data: TokenSource, log: RunLog, ledger: float) -> None:
    args, n = t.args, t.raw.num_params()
    zero = ('ZeRO-3: weights freed after forward' if args.reshard_after_forward
            else 'ZeRO-2: weights kept from forward to backward')
    scheme = (f"FSDP2 over {t.world} processes, {zero}"
              if t.sharded else f"DDP over {t.world} processes" if t.world > 1 else "1 process")
    precision = {"bf16": "bf16", "fp16": "fp16 + GradScaler", "fp32": "fp32"}[t.precision]
    if t.precision != "fp32":
        precision += " MixedPrecisionPolicy (reduce fp32)" if t.sharded else " autocast"
        precision += ", fp32 master weights"
    log(f"model {n:,} parameters | {scheme} on {t.device.type} | micro-batch {args.micro_batch} × seq "
        f"{args.seq_len} × {t.world} × accumulation {t.accum} = {args.global_batch_tokens:,} tokens per step")
    log(f"data: {data.name}, {len(data):,} tokens; each step reads {args.global_batch_tokens / len(data):.3g} "
        f"of it | tokenizer: {data.tokenizer_name} | precision: {precision} | compile: {t.compiled}"
        f" | activation checkpointing: {'on' if args.checkpoint_activations else 'off'} | "
        f"{peak_flops(t.device, args.peak_tflops)[1]}")
    log(f"memory ledger (code/memory.py), {SCHEME_NAMES[t.ledger_scheme]} on a GPU (bf16 autocast, flash "
        f"attention, eager): {ledger:,.0f} MiB per device, of which weights, gradients and optimizer state "
        f"{ledger_state_mib(t):,.2f} MiB")


# ---- the run ---------------------------------------------------------------------------------------------

def main(argv=None):
    args = build_parser().parse_args(argv)
    ranks = launch_ranks()
    accum = check_args(args, ranks.world)
    out = Path(args.out)
    problem = output_problem(out, "dir")
    if problem:
        refuse(f"--out {problem}")
    found = complete_checkpoints(out)
    resume = None
    if args.resume or (args.auto_resume and found):
        if not found:
            refuse(f"--resume: there is no complete checkpoint in {out / CKPT_DIR}")
        resume = (found[-1], check_checkpoint(found[-1], model_config(args)))
    elif found:
        refuse(f"{found[-1]} exists; pass --resume to continue it or choose another --out")
    device = setup_device(args, ranks.local_rank)
    precision = resolve_precision(args.precision, device)
    data = TokenSource(args.data, args.vocab_size, args.seq_len, args.tokenizer)
    if ranks.rank == 0:
        remove_partial_saves(out)
    with process_group("nccl" if device.type == "cuda" else "gloo", timeout_s=args.timeout_s):
        try:
            code = run(args, device, ranks.rank, ranks.world, accum, precision, data, resume)
        except (dist.DistError, RuntimeError) as e:  # a collective timed out or a peer died: say so, not C++
            if not isinstance(e, dist.DistError) and not any(w in str(e) for w in COLLECTIVE_WORDS):
                raise
            print(f"error: process {ranks.rank}: a collective failed ({type(e).__name__}: "
                  f"{str(e).strip().splitlines()[0][:160]}); another process died or waited longer than "
                  f"--timeout-s {args.timeout_s:g}", file=sys.stderr)
            os._exit(EXIT_TIMEOUT)  # leaving the group could hang on the dead peer
    sys.exit(code)


def run(args, device, rank: int, world: int, accum: int, precision: str, data: TokenSource, resume) -> int:
    """Train from the start or from `resume` (folder, state) to --steps; return the exit status."""
    stop = StopFlag()  # from now on SIGTERM/SIGUSR1 stop the run at a step boundary, with a checkpoint
    t = setup(args, device, rank, world, accum, precision, data)
    start = 0
    if resume is not None:
        start = load_checkpoint(t, *resume)
    log = RunLog(t, start)
    if start:
        log(f"resumed from {resume[0].name} at step {start} (saved by {resume[1]['world_size']} process(es), "
            f"{resume[1]['shard']})")
    n_params = t.raw.num_params()
    ledger = ledger_mib(args, n_params, world, t.ledger_scheme, accum if t.sharded else 1)
    describe_run(t, data, log, ledger)
    peak, _ = peak_flops(device, args.peak_tflops)
    flops_tok = flops_per_token(t.raw.cfg, n_params)
    evaluator = Evaluator(t, data)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t.model.train()
    loss_sum = torch.zeros((), device=device)  # summed on the device: no .item() sync every step
    clock, steps_since = time.perf_counter(), 0
    for step in range(start, args.steps):
        loss, norm = train_step(t, step)
        loss_sum += loss
        steps_since += 1
        done = step + 1
        log_now = done % args.log_every == 0 or done == args.steps
        save_now = done == args.steps or (args.save_every and done % args.save_every == 0)
        if (log_now or save_now) and any_rank(not (torch.isfinite(loss_sum) & torch.isfinite(norm)), device):
            # nothing is stepped or saved: the last checkpoint on disk is the last good state
            log(f"error: the loss or gradient became NaN/inf at or before step {done}; stopping. The last good "
                f"checkpoint is in {Path(args.out) / CKPT_DIR} (if one was saved); lower --lr or check the data, "
                "then --resume")
            log.end(EXIT_NAN)
            return EXIT_NAN
        held = held_bytes(t) if done == start + 1 else None  # the gradients exist until the step
        optimizer_step(t)
        if held:
            held["optimizer"] = held_bytes(t)["optimizer"]  # AdamW's moments exist from the first step
            parts = ", ".join(f"{k} {v / 2**20:,.2f} MiB" for k, v in held.items())
            log(f"state held by process 0, counted from its local shards: {parts} "
                f"(ledger {ledger_state_mib(t):,.2f} MiB in all)")
        if log_now:
            dt = time.perf_counter() - clock  # .item() below waits for the device: the clock is honest
            log_step(t, log, done, mean_across_ranks(loss_sum / steps_since).item(), norm.item(), steps_since,
                     dt, peak, flops_tok, ledger)
            loss_sum.zero_()
            clock, steps_since = time.perf_counter(), 0
        paused = time.perf_counter()  # evaluating and saving are not training: keep them out of tokens/s
        if args.eval_every and (done % args.eval_every == 0 or done == args.steps):
            evaluator.report(log, done)
        t.faults.at_boundary(t, stop, done)
        stopping = any_rank(stop.signum or 0, device)  # every process stops at the same step
        if save_now or stopping:
            save_checkpoint(t, done)
        clock += time.perf_counter() - paused
        if stopping:
            stop.ignore_more()  # heard: the launcher's own SIGTERM to the others must not kill them now
            export_weights(t)
            log(f"stopped by {signal.Signals(stopping).name} after step {done}: checkpoint "
                f"{CKPT_DIR}/{step_dir(Path(), done).name} saved; exit status {EXIT_PREEMPTED}, continue with --resume")
            log.end(EXIT_PREEMPTED)
            if world > 1:
                dist.barrier()  # all exit together, after rank 0 recorded the exit status
            return EXIT_PREEMPTED
    finish(t, log, ledger, data.tokenizer)
    return 0


def log_step(t: Trainer, log: RunLog, done: int, mean_loss: float, norm: float, steps: int, dt: float, peak,
             flops_tok, ledger: float) -> None:
    lr = t.opt.param_groups[0]["lr"]
    tok_s = t.args.global_batch_tokens * steps / dt
    mfu = None if peak is None else flops_tok * tok_s / (peak * t.world)
    cuda = t.device.type == "cuda"
    peak_mib = torch.cuda.max_memory_allocated(t.device) / 2**20 if cuda else None
    line = (f"step {done:5d}/{t.args.steps} | loss {mean_loss:.4f} | lr {lr:.2e} | grad norm {norm:.3f} | "
            f"{tok_s:,.0f} tokens/s | {1000 * dt / steps:.1f} ms/step")
    if mfu is not None:
        line += f" | MFU {100 * mfu:.1f}%"
    if cuda:
        line += f" | peak mem {peak_mib:,.0f} MiB (ledger {ledger:,.0f} MiB)"
    if t.scaler is not None:
        line += f" | fp16 steps skipped {t.skipped}"
    log(line)
    log.jsonl({"step": done, "train_loss": mean_loss, "lr": lr, "grad_norm": norm, "tokens_per_s": tok_s, "mfu": mfu,
               "peak_mem_mib": peak_mib, "skipped_steps": t.skipped})


class Evaluator:
    """Validation loss and bits per byte on the same fixed batches every time, on every process."""

    def __init__(self, t: Trainer, data: TokenSource):
        self.t, self.batches, self.byte_counts = t, None, None
        if t.args.eval_every:
            self.batches = [(x.to(t.device, torch.int64), y.to(t.device, torch.int64)) for x, y in
                            fixed_batches(data.val, t.args.eval_batches, t.args.micro_batch, t.args.seq_len)]
            if data.tokenizer is not None:
                self.byte_counts = token_bytes(data.tokenizer).to(t.device)

    def report(self, log: RunLog, done: int) -> None:
        with autocast(self.t):
            if self.byte_counts is None:
                loss, bpb = evaluate(self.t.model, self.batches), None
            else:
                loss, bpb = bits_per_byte(self.t.model, self.batches, self.byte_counts)
        log(f"step {done:5d}/{self.t.args.steps} | val loss {loss:.4f}"
            + ("" if bpb is None else f" | val bits per byte {bpb:.4f}"))
        log.jsonl({"step": done, "val_loss": loss, "val_bpb": bpb})


def autocast(t: Trainer):
    if t.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(t.device.type, dtype=t.autocast_dtype)


def finish(t: Trainer, log: RunLog, ledger: float, tokenizer) -> None:
    """The end of a run: the memory line, the one-file export, a sample, the record."""
    if t.device.type == "cuda":
        peak_mib = torch.cuda.max_memory_allocated(t.device) / 2**20
        log(f"memory: peak allocated {peak_mib:,.0f} MiB, ledger {ledger:,.0f} MiB, ratio {peak_mib / ledger:.2f}")
    export_weights(t)
    if t.args.sample_tokens and (t.rank == 0 or t.sharded):  # a sharded forward needs every process
        log(sample_text(t.model if t.sharded else t.raw, tokenizer, t.args, t.device, lambda: autocast(t)))
    log.end(0)
    log(f"done: {t.args.steps} steps; checkpoint in {CKPT_DIR}/, {EXPORT_NAME}, {RECORD_NAME} and {LOG_NAME} in --out")


class StopFlag:
    """Remembers a SIGTERM or SIGUSR1; the loop stops at the next step boundary."""

    def __init__(self):
        self.signum = None
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        self.signum = signum

    def ignore_more(self) -> None:
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def remove_partial_saves(out: Path) -> None:
    """Remove what a run killed mid-save leaves: checkpoint folders without .metadata, .tmp files."""
    complete = set(complete_checkpoints(out))
    for d in sorted((out / CKPT_DIR).glob("step_*")) if (out / CKPT_DIR).is_dir() else []:
        if d not in complete:
            shutil.rmtree(d, ignore_errors=True)
            print(f"removed {CKPT_DIR}/{d.name}, a checkpoint whose save was cut (no .metadata)")
    for name in (EXPORT_NAME, RECORD_NAME):
        stale = out / (name + ".tmp")
        if stale.exists():
            stale.unlink()
            print(f"removed {stale.name}, a partial file left by an interrupted run")


def keep_log_lines(path: Path, last_step: int) -> None:
    """Keep the log lines of steps up to last_step (where a resumed run continues), atomically:
    lines a killed run wrote after its last checkpoint are logged again by the resumed run."""
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


class Faults:
    """Test-only fault injection (--test-faults nan=STEP,inf=STEP,stop=STEP,sleep=MS,hang=STEP): a NaN
    loss from STEP on (what a diverging run shows); an inf gradient at STEP on rank 0 (what an fp16
    overflow leaves); a stop request on the last rank at STEP (what a SIGTERM does); MS milliseconds of
    sleep per step (time for a test to send a real signal); the last rank stuck after STEP (a hung peer)."""

    def __init__(self, nan=None, inf=None, stop=None, sleep=None, hang=None):
        self.nan, self.inf, self.stop, self.sleep, self.hang = nan, inf, stop, sleep, hang

    @classmethod
    def parse(cls, text, parser=None):
        if not text:
            return cls()
        try:
            return cls(**{k: int(v) for k, v in (item.split("=") for item in text.split(","))})
        except (ValueError, TypeError):
            (parser or build_parser()).error(f"--test-faults {text!r}: expected nan=STEP,inf=STEP")

    def after_backward(self, t: Trainer, step: int) -> None:
        if self.inf == step + 1 and t.rank == 0:
            g = next(t.raw.parameters()).grad
            (g.to_local() if hasattr(g, "to_local") else g).view(-1)[0] = float("inf")

    def loss(self, loss, step: int):
        return loss * float("nan") if self.nan is not None and step + 1 >= self.nan else loss

    def at_boundary(self, t: Trainer, stop: "StopFlag", done: int) -> None:
        if self.sleep:
            time.sleep(self.sleep / 1000)
        if self.stop == done and t.rank == t.world - 1:
            stop.signum = signal.SIGTERM
        if self.hang == done and t.rank == t.world - 1:
            time.sleep(3 * t.args.timeout_s)  # past the timeout, then back to a group whose peer is gone


if __name__ == "__main__":
    main()
