"""Train the book's GPT on one or several GPUs.

    python code/train_gpu.py                                         # 1 GPU
    torchrun --standalone --nproc-per-node 8 code/train_gpu.py       # 8 GPUs, DDP
    python code/train_gpu.py --device cpu --d-model 64 --n-layer 2 --n-head 2 --seq-len 64 \
        --micro-batch 4 --steps 20 --log-every 5 --out /tmp/smoke   # the same logic on a CPU

On CUDA: bf16 autocast over fp32 master weights, TF32 for the remaining fp32 matmuls, torch.compile,
DDP (NCCL) that skips the gradient all-reduce on all but the last micro-batch, fused AdamW, pinned
host memory with non-blocking copies. On a CPU: fp32, gloo, plain AdamW, no compile by default.
Gradient accumulation steps = global batch tokens / (micro-batch · seq-len · processes).
--checkpoint-activations keeps only each block's input and recomputes the block during backward
(GPT.checkpoint_blocks): less activation memory for about one more forward pass, same parameters.

Memory: on CUDA the log puts torch's peak allocation beside what the memory ledger (code/memory.py)
predicts for this shape under eager autograd; torch.compile usually needs less than the ledger.

Data: the book's tokens (default) or --data PATH, a flat file of uint16 token ids (see
code/prepare_tokens.py), read through np.memmap so a corpus of many GB never has to fit in memory.
Every process draws the same global micro-batch from one seeded generator and keeps its own rows, so
a run on N processes sees the data a 1-process run sees.

Checkpoints (OUT/ckpt.pt: model, optimizer, step, sampler and RNG states) are written by rank 0 to a
temporary file and renamed, so a run killed at any moment leaves the previous checkpoint intact;
--resume continues it and ends with the same parameters as an uninterrupted run.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import get_batch, load_tokens  # noqa: E402
from gpus import gpu_for_device  # noqa: E402
from measure import flops_per_token  # noqa: E402
from memory import Shape, step_bytes  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from script_support import (Parser, accumulate_gradients, fail, launch_ranks, mean_across_ranks,  # noqa: E402
                            process_group, save_atomic, set_lr)
from train import configure_optimizer, lr_at  # noqa: E402

CKPT_NAME = "ckpt.pt"


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
    a("--data", default=None, help="uint16 token file (code/prepare_tokens.py); default: the book's tokens")
    a("--out", default="out_gpu", help="folder for the checkpoint")
    a("--save-every", type=int, default=500, help="steps between checkpoints (0: only at the end)")
    a("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    a("--log-every", type=int, default=50)
    a("--device", choices=("cuda", "cpu"), default="cuda")
    a("--compile", action=argparse.BooleanOptionalAction, default=None,
      help="torch.compile the model (default: on for CUDA, off for CPU)")
    a("--checkpoint-activations", action="store_true",
      help="recompute each block's activations during backward instead of keeping them (less memory)")
    a("--peak-tflops", type=float, default=None, help="GPU peak for MFU if the name lookup does not know it")
    a("--inject-nan-at", type=int, default=None, help=argparse.SUPPRESS)  # tests the NaN guard
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
    """Training tokens as a 1-D tensor: the book's (int64) or a uint16 memmap (no copy into memory)."""

    def __init__(self, path, vocab_size):
        if path is None:
            self.tokens = load_tokens().train
            self.name = "the book's 全宋词 tokens"
        else:
            path = Path(path)
            if not path.is_file():
                fail(f"--data {path} does not exist (make one with code/prepare_tokens.py)")
            if path.stat().st_size % 2 or path.stat().st_size == 0:
                fail(f"--data {path.name} is not a uint16 token file (its size is odd or zero)")
            # copy-on-write: a writable view for torch that never writes back to the file
            arr = np.memmap(path, dtype=np.uint16, mode="c")
            top = max(int(arr[i:i + (1 << 26)].max()) for i in range(0, len(arr), 1 << 26))
            if top >= vocab_size:
                fail(f"--data {path.name} holds token id {top}, beyond --vocab-size {vocab_size}")
            self.tokens = torch.from_numpy(arr)
            self.name = f"{path.name} (uint16 memmap)"

    def __len__(self):
        return len(self.tokens)


def peak_flops(device, override_tflops):
    """(peak FLOP/s per GPU or None, a note for the log)."""
    if device.type != "cuda":
        return None, "no MFU on CPU (no spec peak to compare with)"
    name = torch.cuda.get_device_name(device)
    if override_tflops:
        return override_tflops * 1e12, f"{name}: peak {override_tflops:g} TFLOP/s from --peak-tflops"
    gpu = gpu_for_device(name)
    if gpu is None:
        return None, f"{name} is not in the peak table (code/gpus.py): no MFU; pass --peak-tflops to get one"
    return gpu.peak_flops, f"{name} → {gpu.name}, bf16 dense peak {gpu.peak_flops / 1e12:g} TFLOP/s"


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
    if args.resume and not (out / CKPT_NAME).is_file():
        fail(f"--resume: there is no checkpoint {CKPT_NAME} in {out}")
    if not args.resume and (out / CKPT_NAME).exists():
        fail(f"{out}/{CKPT_NAME} exists; pass --resume to continue it or choose another --out")
    device = setup_device(args, ranks.local_rank)
    with process_group("nccl" if device.type == "cuda" else "gloo"):
        run(args, device, ranks, accum)


def run(args, device, ranks, accum: int):
    """The training run itself, on this process's device, inside the process group."""
    rank, local_rank, world = ranks
    out = Path(args.out)
    ckpt_path = out / CKPT_NAME
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    cuda = device.type == "cuda"
    use_compile = cuda if args.compile is None else args.compile

    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls left outside autocast use TF32
        torch.backends.cudnn.allow_tf32 = True

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    cfg = GPTConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_layer=args.n_layer,
                    n_head=args.n_head, seq_len=args.seq_len)
    raw = GPT(cfg).to(device)  # fp32 master weights; autocast runs the matmuls in bf16
    raw.checkpoint_blocks = args.checkpoint_activations  # set before compile and DDP wrap the model
    opt = configure_optimizer(raw, args.lr, args.weight_decay, fused=True if cuda else None)
    data = TokenSource(args.data, args.vocab_size)
    gen = torch.Generator().manual_seed(args.seed + 1)  # the sampler: same stream on every rank
    start = 0

    if args.resume:
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        if ck["model_config"] != vars(cfg):
            fail(f"the checkpoint's model {ck['model_config']} differs from this run's {vars(cfg)}")
        raw.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        gen.set_state(ck["sampler_rng"])
        torch.set_rng_state(ck["cpu_rng"])
        if cuda and ck.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ck["cuda_rng"][local_rank % len(ck["cuda_rng"])])
        start = ck["step"]
        log(f"resumed from {CKPT_NAME} at step {start}")

    model = torch.compile(raw) if use_compile else raw
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[local_rank] if cuda else None)

    n_params = raw.num_params()
    flops_tok = flops_per_token(cfg, n_params)
    peak, peak_note = peak_flops(device, args.peak_tflops)
    tokens_per_step = args.global_batch_tokens
    log(f"model {n_params:,} parameters | {world} process(es) on {device.type} | micro-batch {args.micro_batch} "
        f"× seq {args.seq_len} × {world} × accumulation {accum} = {tokens_per_step:,} tokens per step")
    log(f"data: {data.name}, {len(data):,} tokens; each step reads {tokens_per_step / len(data):.3g} "
        f"of it | precision: {'bf16 autocast, fp32 master weights, TF32' if cuda else 'fp32'} | "
        f"compile: {use_compile} | activation checkpointing: {'on' if args.checkpoint_activations else 'off'} | "
        f"{peak_note}")
    ledger = None  # the GPU path's prediction; the CPU runs other kernels (fp32, blocked loss)
    if cuda:
        ledger = ledger_mib(args, n_params, world)
        log(f"memory ledger (code/memory.py): {ledger:,.0f} MiB per GPU predicted for eager autograd; "
            f"torch.compile usually needs less")

    def batch():
        # one global micro-batch from the shared generator; this rank keeps its rows
        x, y = get_batch(data.tokens, args.micro_batch * world, args.seq_len, gen)
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
            }, ckpt_path)
        if world > 1:
            dist.barrier()

    def all_finite(loss_sum, norm) -> bool:
        bad = (~torch.isfinite(loss_sum) | ~torch.isfinite(norm)).float()
        if world > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # every rank takes the same decision
        return bad.item() == 0

    out.mkdir(parents=True, exist_ok=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    loss_sum = torch.zeros((), device=device)  # summed on the device: no .item() sync every step
    t_last, steps_since = time.perf_counter(), 0
    for step in range(start, args.steps):
        lr = lr_at(step, args.lr, args.warmup, args.steps, args.min_lr_ratio)
        set_lr(opt, lr)
        # all-reduce the gradients once, after the last micro-batch: the big batch's mean gradient
        loss = accumulate_gradients(model, [batch() for _ in range(accum)],
                                    no_sync=model.no_sync if world > 1 else None,
                                    autocast_dtype=torch.bfloat16 if cuda else None)
        if args.inject_nan_at is not None and step + 1 >= args.inject_nan_at:
            loss = loss * float("nan")  # what a diverging run shows
        loss_sum += loss
        norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), args.grad_clip if args.grad_clip else float("inf"))
        steps_since += 1
        done = step + 1
        log_now = done % args.log_every == 0 or done == args.steps
        save_now = done == args.steps or (args.save_every and done % args.save_every == 0)
        if (log_now or save_now) and not all_finite(loss_sum, norm):
            # nothing is stepped or saved: the last checkpoint on disk is the last good state
            log(f"error: the loss or gradient became NaN/inf at or before step {done}; stopping. The last good "
                f"checkpoint is {out / CKPT_NAME} (if one was saved); lower --lr or check the data, then --resume")
            sys.exit(3)  # process_group() leaves the group on the way out
        opt.step()
        opt.zero_grad(set_to_none=True)
        if log_now:
            # .item() also waits for the GPU: the clock below is honest
            mean_loss = mean_across_ranks(loss_sum / steps_since).item()
            dt = time.perf_counter() - t_last
            tok_s = tokens_per_step * steps_since / dt
            line = (f"step {done:5d}/{args.steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                    f"{tok_s:,.0f} tokens/s | {1000 * dt / steps_since:.1f} ms/step")
            if peak is not None:
                line += f" | MFU {100 * flops_tok * tok_s / (peak * world):.1f}%"
            if cuda:
                line += (f" | peak mem {torch.cuda.max_memory_allocated(device) / 2**20:,.0f} MiB"
                         f" (ledger {ledger:,.0f} MiB)")
            log(line)
            loss_sum.zero_()
            t_last, steps_since = time.perf_counter(), 0
        if save_now:
            t_save = time.perf_counter()
            checkpoint(done)
            t_last += time.perf_counter() - t_save  # saving is not training: keep it out of tokens/s
    if cuda:
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
        log(f"memory: peak allocated {peak_mib:,.0f} MiB, ledger {ledger:,.0f} MiB, ratio {peak_mib / ledger:.2f}")
    log(f"done: {args.steps} steps; last checkpoint {CKPT_NAME} in --out")


if __name__ == "__main__":
    main()
