"""Train the book's GPT on one or several GPUs, replicated (DDP) or sharded (FSDP2, HSDP).

    python code/train_gpu.py                                         # 1 GPU
    torchrun --standalone --nproc-per-node 8 code/train_gpu.py       # 8 GPUs, DDP
    torchrun --standalone --nproc-per-node 8 code/train_gpu.py --shard fsdp   # 8 GPUs, sharded (ZeRO-3)
    torchrun --nnodes 8 --nproc-per-node 8 ... code/train_gpu.py --shard hsdp  # 64: sharded per machine (HSDP)
    python code/train_gpu.py --device cpu --d-model 64 --n-layer 2 --n-head 2 --seq-len 64 \\
        --micro-batch 4 --global-batch-tokens 1024 --steps 20 --log-every 5 --out /tmp/smoke   # on a CPU
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id RUN code/train_gpu.py           # two machines, run on each (launch/: Slurm, SkyPilot)

Copy to the box: the folder code/ whole, requirements-train.txt (`pip install -r requirements-train.txt`:
torch, numpy, sentencepiece) and your --data file (code/prepare_tokens.py) or data/songci.txt.
`python code/budget.py ...` prints the command for the scheme and micro-batch that fit; `--preflight`
measures the box against that plan in about a minute before you pay for the run (code/preflight.py).

Exit status: 0 done; 1 a bad file, setting or checkpoint, or out of memory; 2 a bad argument; 3 the loss
became NaN/inf; 4 a process did not join or a collective timed out; 74 a checkpoint could not be saved;
75 stopped by SIGTERM/SIGUSR1 after saving a checkpoint (continue with --resume); 78 --preflight found the
box unlike the plan. Each in full, the files in --out, resuming, stopping and hangs: --help.
"""
import argparse
import contextlib
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint  # noqa: E402
import preflight  # noqa: E402
from arguments import REFUSED, fail, fraction, non_negative, non_negative_int, positive, positive_int, refuse  # noqa: E402,E501
from checkpoint import (  # noqa: E402
    CKPT_DIR,
    EXIT_SAVE_FAILED,
    EXPORT_NAME,
    complete_checkpoints,
    load_checkpoint,
    newest_loadable,
    step_dir,
)
from data import TokenSource  # noqa: E402
from evaluation import Evaluator, sample_text  # noqa: E402
from gpus import describe_peak  # noqa: E402
from model import GPT, GPTConfig, init_per_parameter  # noqa: E402
from optimizer import configure_optimizer, lr_at  # noqa: E402
from run_log import LOG_NAME, RECORD_NAME, RunLog, end_current  # noqa: E402
from sampler import Sampler  # noqa: E402
from script_support import (  # noqa: E402
    Parser,
    launch_ranks,
    mean_across_ranks,
    output_problem,
    process_group,
    set_lr,
)
from shapes import Run, Shape, flops_per_token, param_count, run_peak_bytes, run_sent_bytes, run_state_bytes  # noqa: E402,E501

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
EXIT_NAN, EXIT_TIMEOUT, EXIT_PREEMPTED = 3, 4, 75  # 75: EX_TEMPFAIL, "try again"
# the signals a scheduler sends before it kills a job (Slurm's --signal, SkyPilot, torchrun's forward):
# only those this platform has (Windows has no SIGUSR1), so the script imports everywhere
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))
STOP_POLL_S = 10.0  # wall seconds between polls of the stop flag (plus every log and save step)
WARMUP_UNTIMED = 5  # a run's first steps compile and warm up: kept out of tokens/s, as nanoGPT does
COLLECTIVE_WORDS = ("gloo", "NCCL", "Timed out", "timed out", "Connection closed")  # a failed collective's words
DEFAULT_GLOBAL_BATCH_TOKENS = 2**19  # 524,288 tokens per step, GPT-3 Small's 0.5M
NCCL_ERRORS_VAR = "TORCH_NCCL_ASYNC_ERROR_HANDLING"  # read by ProcessGroupNCCL when a group is created
RESUME_SETTINGS = ("lr", "warmup", "min_lr_ratio", "weight_decay", "global_batch_tokens", "seed", "steps")


HELP_EPILOG = f"""\
Exit status: 0 done; 1 a bad file, setting or checkpoint, processes that see different checkpoints, an --out
that not every process sees or a --data of another length on some (checked once they join), or out of memory
(one line on stderr, with the memory ledger's figure and what to lower first); 2 a bad argument; 3 the loss
or a gradient became NaN/inf (nothing saved after the last good checkpoint); 4 a process did not join or a
collective waited past its timeout; {EXIT_SAVE_FAILED} a checkpoint could not be saved (the earlier ones kept; also
when it was the stop's save: not requeued, the disk needs room first); {EXIT_PREEMPTED} stopped by SIGTERM/SIGUSR1
after saving a checkpoint (resume with --resume); {preflight.EXIT_WARNED} --preflight found the box unlike the plan (a
line marked WARN; 0 when every check is ok). From the start of training on, rank 0 records its status in
run.json, except where torch aborts (below) or another process failed first (out of memory there: torchrun
ends rank 0).

Files in --out, each written whole and renamed, never appended to (a bucket mounted by goofys refuses
appends): checkpoints/step_NNNNNNNN/, a checkpoint (code/checkpoint.py): every process's
torch.distributed.checkpoint shards, train_state.json and .metadata, written last; a folder without
.metadata is a cut save, removed on the next start. The newest {checkpoint.KEEP} complete ones are kept (the disk must
hold {checkpoint.KEEP+1} while one is written). model.pt: the final weights as one plain state_dict, written by rank 0
when a run reaches --steps; no process waits on that write. run.json (code/run_log.py, rank 0): command,
arguments, commit, devices, versions, times, exit status, the records of the interrupted runs a resumed one
continues, and the launcher's TRAIN_ATTEMPT (launch/slurm.sbatch requeues only on a {EXIT_PREEMPTED} of its own
attempt). log.jsonl: one JSON line per log step (on resume, the lines after the checkpoint's step are
dropped: the resumed run logs them again).

Resuming: --resume continues from the newest complete checkpoint on any number of processes and either
scheme, once the processes have checked that each chose the same step; --auto-resume does so if there is one
(launch/ uses it). On the same processes and scheme the run ends bitwise equal to the uninterrupted one. A
newest checkpoint damaged after its save (a bad .metadata or train_state.json, a missing or short shard) is
named and passed over for the one before, and removed once the processes agree; one whose damage only the
load finds is refused in a sentence naming the one before, which resumes once the damaged folder is moved
away. A changed --lr, --warmup, --min-lr-ratio, --weight-decay, --global-batch-tokens, --seed or --steps is
printed; a checkpoint beyond --steps is refused. A load calls nothing outside an exact list of DCP's record
classes and changes no object it did not make.

Stopping: on SIGTERM or SIGUSR1 (Windows has only SIGTERM) every process finishes its step; they agree at
the next poll (about every {STOP_POLL_S:g} s of wall time, at a step they agreed on, and at every log and save step:
one all-reduce, no host sync on the other steps), save a checkpoint, rank 0 records {EXIT_PREEMPTED} in run.json, and
all exit {EXIT_PREEMPTED} without writing model.pt, to fit torchrun's --shutdown-timeout (launch/ sets it);
launch/slurm.sbatch requeues on {EXIT_PREEMPTED}.

Hangs: joining and the first step (compilation) may wait --timeout-s for another process, every later
collective --step-timeout-s, in every process group (HSDP's too, as torchtitan does). On gloo a longer wait
raises: one sentence, exit 4. On NCCL the script sets {NCCL_ERRORS_VAR}=2 where it is unset or
torchrun's 1 (run.json records it): the watchdog aborts the communicator and the error reaches Python (exit
4) where the host waits on the collective. Where torch aborts without a Python exception (a CUDA error, the
watchdog's heartbeat timeout, a 0 or 3 you exported), the process dies by SIGABRT with torch's own lines,
torchrun reports the rank failed, and run.json keeps "exit_code": null."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="train_gpu.py", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=HELP_EPILOG,
               description="Train the book's GPT on 1..N GPUs (or a CPU, as a smoke test), replicated (DDP) or "
               "sharded (FSDP2, HSDP).\nCopy the folder code/ whole, requirements-train.txt and your --data (or "
               "data/songci.txt);\npython code/budget.py prints the command for your model and GPUs.")
    a = p.add_argument
    a("--d-model", type=positive_int, default=512)
    a("--n-layer", type=positive_int, default=8)
    a("--n-head", type=positive_int, default=8)
    a("--seq-len", type=positive_int, default=512)
    a("--vocab-size", type=positive_int, default=8192, help="at least the tokenizer's (the book's: 8192)")
    a("--micro-batch", type=positive_int, default=32, help="sequences per process per forward pass")
    a("--global-batch-tokens", type=positive_int, default=DEFAULT_GLOBAL_BATCH_TOKENS,
      help="tokens per optimizer step over all processes, the same for any number of processes; "
           "accumulation steps = it / (micro-batch × seq-len × processes) (default %(default)s)")
    a("--shard", choices=("ddp", "fsdp", "hsdp"), default="ddp",
      help="ddp: every GPU holds the whole model; fsdp: weights, gradients and optimizer state sharded (FSDP2) "
           "over all processes; hsdp: sharded inside each group of --shard-size processes (a machine), "
           "replicated across the groups, whose gradient shards one all-reduce per step sums (with one process "
           "fsdp and hsdp train the plain model; ZeRO-1 is not implemented)")
    a("--shard-size", type=positive_int, default=None,
      help="with --shard hsdp: processes per shard group; it must divide the processes of a machine "
           "(default: all of them, torchrun's LOCAL_WORLD_SIZE)")
    a("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
      help="with --shard fsdp: free the gathered weights after forward (ZeRO-3, default) or keep them "
           "until backward (--no-...: one all-gather less per micro-batch, more memory; ZeRO-2 in the ledger)")
    a("--grad-sync", choices=("last", "every"), default="last",
      help="with --shard fsdp and accumulation: last (default) holds the whole fp32 gradients until the step's "
           "last micro-batch and reduce-scatters once; every reduce-scatters after each micro-batch, as "
           "torchtitan does: the gradients stay shards, for (accumulation - 1) more reduce-scatters per step. "
           "code/budget.py prints every where the whole gradients do not fit")
    a("--steps", type=positive_int, default=2000)
    a("--lr", type=positive, default=1e-3)
    a("--warmup", type=non_negative_int, default=100)
    a("--min-lr-ratio", type=fraction, default=0.1, help="the final learning rate as a fraction of --lr (0 to 1)")
    a("--weight-decay", type=non_negative, default=0.1)
    a("--grad-clip", type=non_negative, default=1.0, help="clip the gradients' global norm to this (0: no clipping)")
    a("--seed", type=non_negative_int, default=0)
    a("--data", default=None, help="uint16 token file (code/prepare_tokens.py); default: the book's tokens. "
      "Its last 5%% is held out for validation and never trained on")
    a("--tokenizer", default=None, help="SentencePiece model of --data, for bits per byte and the sample "
      "(default: the book's, or DATA's .tokenizer.model written by prepare_tokens.py)")
    a("--out", default="out_gpu", help="folder for checkpoints, model.pt, run.json and log.jsonl")
    a("--save-every", type=non_negative_int, default=500, help="steps between checkpoints (0: only at the end)")
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue from the newest complete checkpoint in --out, on any number of processes")
    resume.add_argument("--auto-resume", action="store_true",
                        help="as --resume if --out holds a complete checkpoint, else start afresh (for requeued jobs)")
    a("--timeout-s", type=positive, default=600,
      help="seconds joining and the first step (compilation) may wait for the other processes before the "
           "run stops with exit status 4")
    a("--step-timeout-s", type=positive, default=None,
      help="seconds a collective may wait after the first step (default: the smaller of --timeout-s and 300)")
    a("--log-every", type=positive_int, default=50)
    a("--eval-every", type=non_negative_int, default=0, help="steps between validation evaluations (0: none)")
    a("--eval-batches", type=positive_int, default=8, help="fixed validation micro-batches per evaluation")
    a("--sample-tokens", type=non_negative_int, default=64, help="tokens of text generated at the end (0: none)")
    a("--device", choices=("cuda", "cpu"), default="cuda")
    a("--precision", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
      help="auto: bf16 where the GPU has it, else fp16 with loss scaling; fp32 on a CPU")
    a("--compile", action=argparse.BooleanOptionalAction, default=None,
      help="torch.compile the model (default: on for CUDA, off for CPU)")
    a("--checkpoint-activations", action="store_true",
      help="recompute each block's activations during backward instead of keeping them (less memory)")
    a("--peak-tflops", type=positive, default=None, help="GPU peak for MFU if the name lookup does not know it")
    a("--preflight", action="store_true", help="measure this box against the plan in about a minute (matmul, "
      "all-reduce, host-to-device, disk and the save against --notice-s, /dev/shm, memory for training and "
      "evaluation, topology: code/preflight.py) and train nothing")
    a("--notice-s", type=positive, default=30, help="seconds from the launcher's stop signal to the kill, half of "
      "which --preflight gives the save: about 30 on GCP spot (default), 120 on AWS; launch/ sets it")
    return p


# ---- the run, in the order it happens ----------------------------------------------------------------

def main(argv=None):
    args = build_parser().parse_args(argv)
    # from the start, SIGTERM/SIGUSR1 stop the run at a step boundary with a checkpoint: a notice that arrives
    # while the data loads or the processes join takes effect at the first step instead of killing them
    stop = StopFlag()
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
        # a newer one damaged after its save is named and passed over (checkpoint.py keeps two)
        resume = newest_loadable(found, model_config(args), print if ranks.rank == 0 else lambda *a: None)
        if resume[1]["step"] > args.steps:  # the schedule cannot run backwards
            refuse(f"--resume: {resume[0].name} is at step {resume[1]['step']}, beyond --steps {args.steps}; "
                   "pass a larger --steps to train on")
    elif found and not args.preflight:
        refuse(f"{found[-1]} exists; pass --resume to continue it or choose another --out")
    device = setup_device(args, ranks.local_rank)
    precision = resolve_precision(args.precision, device)
    data = TokenSource(args.data, args.vocab_size, args.seq_len, args.tokenizer, ranks.rank, ranks.world)
    if ranks.rank == 0:
        checkpoint.remove_partial_saves(out, (RECORD_NAME,))
    nccl_error_handling()  # before any process group: NCCL reads it when a group is made
    joined = False
    RunLog.current = None  # the log of an earlier main() in this process (the tests) is not this run's
    try:
        with process_group("nccl" if device.type == "cuda" else "gloo", timeout_s=args.timeout_s):
            joined = True
            check_shared_folders(out, data, device, ranks.rank, ranks.world)
            agree_on_resume(args, resume, device, ranks.world)
            if resume is not None and ranks.rank == 0:
                checkpoint.remove_newer(out, resume[1]["step"])
            code = run(args, device, ranks.rank, ranks.world, accum, precision, data, resume, stop)
    except checkpoint.SaveFailed as e:  # every process raises it; the complete checkpoints are kept
        stop_with(ranks, EXIT_SAVE_FAILED, str(e))
    except torch.OutOfMemoryError as e:  # before RuntimeError, which it is
        ledger = ledger_mib(planned_run(args, ranks.world, accum, precision),
                            param_count(args.d_model, args.n_layer, args.vocab_size))
        stop_with(ranks, REFUSED, f"process {ranks.rank} ran out of memory on {device} ({first_line(e)}); the "
                  f"memory ledger planned {ledger:,.0f} MiB per GPU for this run. Lower --micro-batch first "
                  "(--global-batch-tokens stays: accumulation grows), then --seq-len, then add "
                  "--checkpoint-activations, then use more GPUs or --shard fsdp; python code/budget.py prints "
                  "what fits", every_rank=True)
    except (dist.DistError, RuntimeError) as e:  # a peer never came, died or hung: say so, not C++
        if not isinstance(e, dist.DistError) and not any(w in str(e) for w in COLLECTIVE_WORDS):
            raise
        why = f"{type(e).__name__}: {first_line(e)}"
        if not joined:
            fail(f"process {ranks.rank}: the other processes did not all join within --timeout-s "
                 f"{args.timeout_s:g} ({why}); start every process of the launch (torchrun on each node) within "
                 "that time", EXIT_TIMEOUT)
        stop_with(ranks, EXIT_TIMEOUT, f"process {ranks.rank}: a collective failed ({why}); another process died "
                  f"or waited longer than --timeout-s {args.timeout_s:g} (after the first step --step-timeout-s "
                  f"{step_timeout(args):g})", every_rank=True)
    sys.exit(code)


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def stop_with(ranks, code: int, message: str, every_rank=False):
    """End a run that an exception stopped: `error: message` on stderr (rank 0's, or every rank's), the
    status recorded in run.json (rank 0, once its log exists), and exit. Over several processes without
    leaving the group, which could hang on a dead peer (the launcher ends the others)."""
    end_current(code)
    if every_rank or ranks.rank == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    if ranks.world == 1:
        sys.exit(code)
    sys.stdout.flush()
    os._exit(code)


def check_shared_folders(out: Path, data: "TokenSource", device, rank: int, world: int) -> None:
    """--out must be one folder every process sees (a node-local disk holds only its node's shards, and
    the mistake would show at the first resume, after the preemption the checkpoints were for), and --data
    the same tokens everywhere. Rank 0 writes a file with a fresh name into --out, every process looks for
    it after one all-reduce that hands them the name, and a second all-reduce tells all whether any missed
    it or read another token count; refuse (exit 1) in one sentence before training if so."""
    if world == 1:
        return
    nonce = torch.tensor(secrets.randbits(62) if rank == 0 else 0, device=device)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / f".shared-{int(nonce):x}").write_text("written by process 0 for the others to find\n")
    dist.all_reduce(nonce)  # a sum: rank 0's value, and every process is past its write
    mark = out / f".shared-{int(nonce):x}"
    x = torch.tensor([int(not mark.is_file()), len(data), -len(data)], device=device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)  # the others have all looked once this returns
    missed, most, fewest = int(x[0]), int(x[1]), -int(x[2])
    if rank == 0:
        mark.unlink(missing_ok=True)
    if missed:
        why = (f"--out {out} is not one folder that every process sees: a file process 0 wrote there is missing "
               f"on other processes; put --out on storage every node mounts (not a node-local disk such as /tmp)")
    elif most != fewest:
        why = (f"--data: the processes read token files of {fewest:,} and {most:,} tokens; --data must be "
               "the same file on every node")
    else:
        return
    if rank == 0:
        refuse(why)
    sys.exit(REFUSED)  # the others quietly: rank 0's line says it


def agree_on_resume(args, resume, device, world: int) -> None:
    """Every process listed --out on its own before joining (a bucket mount that is still syncing can
    show each a different newest checkpoint): one all-reduce of the chosen step's maximum and minus its
    minimum; refuse (exit 1) unless they are the same."""
    if world == 1:
        return
    step = -1 if resume is None else resume[1]["step"]
    x = torch.tensor([step, -step], device=device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    high, low = int(x[0]), -int(x[1])
    if high != low:
        def name(s):
            return "no checkpoint" if s < 0 else step_dir(Path(), s).name
        refuse(f"--resume: the processes do not see the same checkpoints in {Path(args.out) / CKPT_DIR}: some chose "
               f"{name(low)}, others {name(high)}; --out must be the same folder on every node, complete (wait "
               "for a copy or a bucket mount to finish) before the run resumes")


def run(args, device, rank: int, world: int, accum: int, precision: str, data: "TokenSource", resume,
        stop: "StopFlag") -> int:
    """Train from the start or from `resume` (folder, state) to --steps; return the exit status."""
    data.check_ids(device)
    t = setup(args, device, rank, world, accum, precision, data)
    if args.preflight:  # measure the box, train nothing; a warning is a status a launch script can stop on
        plan, n = planned_run(args, world, accum, precision), t.raw.num_params()
        warnings = preflight.run(t, ledger_mib(plan, n), print if rank == 0 else lambda *a: None,
                                 eval_mib=preflight.eval_peak_mib(plan, n) if args.eval_every else None)
        return preflight.EXIT_WARNED if warnings else 0
    start = 0 if resume is None else load_checkpoint(t, *resume)
    settle_ddp_buckets(t)  # so that a resume on the same processes ends bitwise equal to the run it continues
    log = RunLog(args, device, rank, world, precision, start)
    if start:
        log(f"resumed from {resume[0].name} at step {start} (saved by {resume[1]['world_size']} process(es), "
            f"{resume[1]['shard']})")
        for name, (old, new) in changed_settings(args, resume[1]).items():
            log(f"resume: --{name.replace('_', '-')} is {new}, the checkpoint was trained with {old}")
    n_params = t.raw.num_params()
    ledger = ledger_mib(planned_run(args, world, accum, precision), n_params)
    describe_run(t, data, log, ledger)
    peak, _ = peak_flops(device, args.peak_tflops)
    flops_tok = flops_per_token(t.raw.cfg, n_params)
    evaluator = Evaluator(t, data, lambda: autocast(t))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t.model.train()
    loss_sum = torch.zeros((), device=device)  # summed on the device: no .item() sync every step
    clock, steps_since, timed = time.perf_counter(), 0, 0
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
            shorten_timeout(t)
        if done - start <= WARMUP_UNTIMED:  # compilation and warm-up: restart the clock
            clock, timed = time.perf_counter(), 0
        else:
            timed += 1
        if log_now:
            dt = time.perf_counter() - clock  # .item() below waits for the device: the clock is honest
            log_step(t, log, done, mean_across_ranks(loss_sum / steps_since).item(), norm.item(), timed,
                     dt, peak, flops_tok, ledger)
            loss_sum.zero_()
            clock, steps_since, timed = time.perf_counter(), 0, 0
        paused = time.perf_counter()  # evaluating and saving are not training: keep them out of tokens/s
        if args.eval_every and (done % args.eval_every == 0 or done == args.steps):
            evaluator.report(log, done)
        stopping = stop.agreed(t, done, log_now or save_now)  # and every STOP_POLL_S (StopFlag)
        if save_now or stopping:
            save_checkpoint(t, done)
        clock += time.perf_counter() - paused
        if stopping:
            stop.ignore_more()  # heard: the launcher's own SIGTERM to the others must not kill them now
            log.end(EXIT_PREEMPTED)  # recorded before anything else can be cut short
            log(f"stopped by {signal.Signals(stopping).name} after step {done}: checkpoint "
                f"{CKPT_DIR}/{step_dir(Path(), done).name} saved; exit status {EXIT_PREEMPTED}, continue with --resume")
            if world > 1:
                dist.barrier()  # all exit together, after rank 0 recorded the exit status
            return EXIT_PREEMPTED
    finish(t, log, ledger, data.tokenizer)
    return 0


def finish(t: "Trainer", log: RunLog, ledger: float, tokenizer) -> None:
    """The end of a run: the memory line, the one-file export, a sample, the record."""
    if t.device.type == "cuda":
        peak_mib = torch.cuda.max_memory_allocated(t.device) / 2**20
        log(f"memory: peak allocated {peak_mib:,.0f} MiB, ledger {ledger:,.0f} MiB, ratio {peak_mib / ledger:.2f}")
    if t.args.sample_tokens and (t.rank == 0 or t.sharded):  # a sharded forward needs every process
        log(sample_text(t.model if t.sharded else t.raw, tokenizer, t.args, t.device, lambda: autocast(t)))
    # the gather is the last collective: rank 0 then writes model.pt while the others end, none waiting on it
    checkpoint.export_weights(t.model, t.args.out, t.rank)
    log.end(0)
    log(f"done: {t.args.steps} steps; checkpoint in {CKPT_DIR}/, {EXPORT_NAME}, {RECORD_NAME} and {LOG_NAME} in --out")


# ---- the device, settings and setup ----------------------------------------------------------------

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


def check_args(args, world: int) -> int:
    """Validate what the types cannot (exit 2 with one line); return the number of accumulation steps."""
    p = build_parser()
    if args.d_model % args.n_head or (args.d_model // args.n_head) % 2:
        p.error(f"--d-model {args.d_model} must split into --n-head {args.n_head} heads of even size (RoPE)")
    if args.vocab_size > 65536 and args.data:
        p.error("uint16 token files hold ids below 65,536; --vocab-size is larger")
    if max(args.timeout_s, args.step_timeout_s or 0) > 1e9:  # past what a timedelta holds
        p.error("--timeout-s and --step-timeout-s must be below 1e9 seconds (30 years)")
    if args.shard == "hsdp":
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        args.shard_size = args.shard_size or per_node
        if args.shard_size > per_node or per_node % args.shard_size or world % args.shard_size:
            p.error(f"--shard-size {args.shard_size} must divide the {per_node} processes of a machine "
                    f"(and so the {world} of the run): a shard group's all-gathers stay inside one machine")
        if not args.reshard_after_forward:
            p.error("--shard hsdp frees the gathered weights after forward (ZeRO-3 inside a group); "
                    "--no-reshard-after-forward is for --shard fsdp")
    elif args.shard_size is not None:
        p.error("--shard-size is for --shard hsdp")
    per_micro = args.micro_batch * args.seq_len * world
    if args.global_batch_tokens % per_micro:
        p.error(f"--global-batch-tokens {args.global_batch_tokens:,} is not a positive multiple of micro-batch × "
                f"seq-len × processes = {args.micro_batch} × {args.seq_len} × {world} = {per_micro:,}; "
                f"use e.g. {per_micro * max(1, round(args.global_batch_tokens / per_micro)):,}")
    return args.global_batch_tokens // per_micro


def changed_settings(args, state: dict) -> dict:
    """{setting: (the checkpoint's value, this run's)} for each setting a resume changes."""
    saved = state.get("settings", {})
    return {k: (saved[k], getattr(args, k)) for k in RESUME_SETTINGS if k in saved and saved[k] != getattr(args, k)}


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
    eval_model: torch.nn.Module  # evaluation: without DDP (no collective), or the FSDP model (needs all)
    opt: torch.optim.Optimizer
    scaler: "torch.amp.GradScaler | None"
    sampler: Sampler
    autocast_dtype: "torch.dtype | None"  # DDP: autocast; FSDP: None (its policy casts)
    compiled: bool
    skipped: int = 0  # fp16 steps skipped for an overflow


def shard(model: GPT, args, device, precision: str) -> None:
    """FSDP2 per block, then the root (the tied embedding/head and the final norm). hsdp: on a 2-D mesh,
    (replicate, shard): each parameter is sharded over its group of --shard-size consecutive ranks
    (placements Replicate(), Shard(0)) and its gradient shards are all-reduced across the groups."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    world = dist.get_world_size()
    mesh = (init_device_mesh(device.type, (world // args.shard_size, args.shard_size),
                             mesh_dim_names=("replicate", "shard"))
            if args.shard == "hsdp" else init_device_mesh(device.type, (world,)))
    if args.shard == "hsdp":  # new replicate and shard groups with torch's default timeout (1-D: the default group)
        set_timeouts(args.timeout_s)
    dtype = DTYPES[precision]
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=args.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # FSDP2's root default: kept for backward's first use


def setup(args, device, rank: int, world: int, accum: int, precision: str, data: TokenSource) -> Trainer:
    """Build, shard and initialise the model; the optimizer, the loss scaler and the sampler."""
    cuda = device.type == "cuda"
    use_compile = cuda if args.compile is None else args.compile
    sharded = args.shard in ("fsdp", "hsdp") and world > 1
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls left outside autocast use TF32
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    # sharded: shapes only (meta), so no process ever holds the whole model; materialised after sharding
    with torch.device("meta" if sharded else device):
        raw = GPT(GPTConfig(**model_config(args)))
    raw.recompute_blocks = args.checkpoint_activations  # set before compile and the wrappers
    if sharded:
        if use_compile:
            for block in raw.blocks:  # compiled per block, before sharding, as torchtitan does
                block.compile()
        shard(raw, args, device, precision)
        raw.to_empty(device=device)  # (on a plain model to_empty would untie the embedding and the head)
    init_per_parameter(raw, args.seed)  # the same initial weights, sharded or not
    model = eval_model = raw
    if not sharded:
        model = eval_model = torch.compile(raw) if use_compile else raw
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            # forward_sync_buffers=False (torch 2.13's name for broadcast_buffers=False): DDP would send rank
            # 0's buffers before every forward; the only ones are the RoPE tables, computed alike on every
            # process and never changed (they are still synced once, when DDP is built)
            model = DDP(model, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True,
                        forward_sync_buffers=False)
    opt = configure_optimizer(raw, args.lr, args.weight_decay, fused=True if cuda else None)
    # fp16: scale the loss so small gradients do not underflow; a step with an inf gradient is skipped
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    return Trainer(args=args, device=device, rank=rank, world=world, accum=accum, precision=precision,
                   sharded=sharded, model=model, raw=raw, eval_model=eval_model, opt=opt, scaler=scaler,
                   sampler=Sampler(data.train, args, rank, world, device),
                   autocast_dtype=None if sharded else DTYPES[precision], compiled=use_compile)


# ---- one optimizer step, and what the processes agree on -------------------------------------------

def settle_ddp_buckets(t: Trainer) -> None:
    """DDP lays its gradient buckets out again after the first backward, in the order the gradients became
    ready. An all-reduce sums each number over the processes in an order set by its place in the bucket, so
    over more than 2 processes a run's first step rounds differently from its later ones, and a resumed run
    (whose first step is a later step of the run it continues) ends ~1e-8 away from the uninterrupted one.
    One forward and backward on zeros before the first step, its gradients dropped, makes every step of
    every run reduce with the laid-out-again buckets: resumed on the same processes, bitwise."""
    if t.sharded or t.world == 1:
        return
    grad_sync(t, True)
    x, y = (torch.zeros(t.args.micro_batch, t.args.seq_len, dtype=torch.int64, device=t.device) for _ in "xy")
    with autocast(t):  # as a step runs it, so that torch.compile compiles this graph once
        _, loss = t.model(x, y)
    loss.backward()
    t.opt.zero_grad(set_to_none=True)


def grad_sync(t: Trainer, sync: bool) -> None:
    """Whether the next micro-batch's backward reduces the gradients over the processes (no_sync's switch).
    DDP decides during forward, so this is set before it; nanoGPT sets require_backward_grad_sync alike."""
    if t.world == 1:
        return
    if t.sharded and t.args.grad_sync == "every":
        if t.args.shard == "hsdp":  # reduce-scatter every backward, all-reduce across the groups on the last only
            t.model.set_requires_all_reduce(sync)
        return  # every backward reduce-scatters, so the gradients stay shards
    if t.sharded:
        t.model.set_requires_gradient_sync(sync)  # off: the whole gradients accumulate, unreduced
    else:
        t.model.require_backward_grad_sync = sync  # what DDP's no_sync() switches off and back on


def train_step(t: Trainer, step: int) -> tuple:
    """Forward and backward over the step's micro-batches, clip. Returns (mean loss, gradient norm),
    both tensors on the device, not yet synchronised; optimizer_step then steps AdamW."""
    set_lr(t.opt, lr_at(step, t.args.lr, t.args.warmup, t.args.steps, t.args.min_lr_ratio))
    batches = t.sampler.step_batches()
    loss = torch.zeros((), device=t.device)
    for i, (x, y) in enumerate(batches):
        grad_sync(t, i == len(batches) - 1)  # the reduction runs once, in the last micro-batch's backward
        with autocast(t):
            _, micro_loss = t.model(x, y)
        micro_loss = micro_loss / len(batches)  # backward adds up the gradient of the step's mean loss
        (micro_loss if t.scaler is None else t.scaler.scale(micro_loss)).backward()
        loss += micro_loss.detach()
    if t.scaler is not None:
        t.scaler.unscale_(t.opt)  # true gradients, for clipping; inf/NaN here makes scaler.step skip
        if t.sharded:  # each process saw only its shards: skip the step everywhere or nowhere
            for found in t.scaler._per_optimizer_states[id(t.opt)]["found_inf_per_device"].values():
                dist.all_reduce(found, op=dist.ReduceOp.MAX)
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


def shorten_timeout(t: Trainer) -> None:
    """After the first step (compilation) a collective may wait only --step-timeout-s."""
    if t.world > 1:
        dist.barrier()  # every process is past its first step before the shorter wait applies
        set_timeouts(step_timeout(t.args))


def set_timeouts(seconds: float) -> None:
    """Every process group of this process waits `seconds` in a collective, HSDP's mesh groups too
    (torch makes them with its default: 10 min on NCCL, 30 on gloo), as torchtitan's set_pg_timeouts."""
    c10d = dist.distributed_c10d
    for group in list(c10d._world.pg_map):
        if not c10d._rank_not_in_group(group):
            c10d._set_pg_timeout(timedelta(seconds=seconds), group)


def nccl_error_handling() -> str:
    """TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (CleanUpOnly: the error reaches Python) where it is unset or 1, the
    TearDown (SIGABRT) torchrun's agent writes into every worker's environment (local_elastic_agent.py);
    a 0 or 3 the user exported is kept. run.json records it; gloo ignores it."""
    if os.environ.get(NCCL_ERRORS_VAR) in (None, "1"):
        os.environ[NCCL_ERRORS_VAR] = "2"
    return os.environ[NCCL_ERRORS_VAR]


def step_timeout(args) -> float:
    return args.step_timeout_s or min(args.timeout_s, 300)


class StopFlag:
    """Remembers a SIGTERM or SIGUSR1; the processes agree on it at a poll step, at one step boundary.

    A poll is one all-reduce and a host sync, so it is not made every step: at every log and save step,
    and STOP_POLL_S of wall time after the last poll. Each process's clock would pick another step, so
    each poll also agrees on the next: every process sends how many steps fit in STOP_POLL_S at its own
    pace (measured between the last two polls, where the host waited for the device), the slowest wins,
    and all of them poll again at that step. A stop is agreed within about STOP_POLL_S and a step,
    whether a step takes 50 ms or 8 s."""

    def __init__(self, clock=time.monotonic):
        self.signum, self.clock = None, clock
        self.next_poll = None  # the step at which the processes agree again (None: the first step)
        self.polled = None  # (clock, step) when the last poll's all-reduce returned
        self.step_s = None  # wall seconds per step between the last two polls
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        self.signum = signum

    def agreed(self, t: Trainer, done: int, poll: bool) -> int:
        """The signal any process heard, at a log or save step (`poll`) or at the step the last poll chose
        (the same steps on every process); else 0."""
        if not poll and self.next_poll is not None and done < self.next_poll:
            return 0
        steps = max(1, int(STOP_POLL_S / self.step_s)) if self.step_s else 1
        x = torch.tensor([self.signum or 0, -steps], device=t.device)  # MAX of -steps: the fewest steps
        if dist.is_initialized():
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
        signum, fewest = x.tolist()  # waits for the device: the clock below sees the steps done
        now = self.clock()
        if self.polled is not None and done > self.polled[1]:
            self.step_s = (now - self.polled[0]) / (done - self.polled[1])
        self.polled, self.next_poll = (now, done), done - fewest
        return signum

    def ignore_more(self) -> None:
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


# ---- checkpoints (code/checkpoint.py) and what the log shows --------------------------------------------

def model_config(args) -> dict:
    return vars(GPTConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_layer=args.n_layer,
                          n_head=args.n_head, seq_len=args.seq_len))


def save_checkpoint(t: Trainer, step: int) -> Path:
    return checkpoint.save_checkpoint(t, step, {"model_config": model_config(t.args), "settings": {
        k: getattr(t.args, k) for k in RESUME_SETTINGS}})


def log_step(t: Trainer, log: RunLog, done: int, mean_loss: float, norm: float, steps: int, dt: float, peak,
             flops_tok, ledger: float) -> None:
    """One log line; `steps` timed steps took `dt` seconds (none while warming up)."""
    lr = t.opt.param_groups[0]["lr"]
    tok_s = t.args.global_batch_tokens * steps / dt if steps else None
    mfu = None if peak is None or tok_s is None else flops_tok * tok_s / (peak * t.world)
    cuda = t.device.type == "cuda"
    peak_mib = torch.cuda.max_memory_allocated(t.device) / 2**20 if cuda else None
    line = f"step {done:5d}/{t.args.steps} | loss {mean_loss:.4f} | lr {lr:.2e} | grad norm {norm:.3f} | "
    line += (f"{tok_s:,.0f} tokens/s | {1000 * dt / steps:.1f} ms/step" if steps
             else f"warm-up (the first {WARMUP_UNTIMED} steps are not timed)")
    if mfu is not None:
        line += f" | MFU {100 * mfu:.1f}%"
    if cuda:
        line += f" | peak mem {peak_mib:,.0f} MiB (ledger {ledger:,.0f} MiB)"
    if t.scaler is not None:
        line += f" | fp16 steps skipped {t.skipped}"
    log(line)
    log.jsonl({"step": done, "train_loss": mean_loss, "lr": lr, "grad_norm": norm, "tokens_per_s": tok_s, "mfu": mfu,
               "peak_mem_mib": peak_mib, "skipped_steps": t.skipped})


def autocast(t: Trainer):
    if t.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(t.device.type, dtype=t.autocast_dtype)


def describe_run(t: Trainer, data: TokenSource, log: RunLog, ledger: float) -> None:
    args, n = t.args, t.raw.num_params()
    run = planned_run(args, t.world, t.accum, t.precision)
    log(f"model {n:,} parameters | {run.where()} on {t.device.type} | micro-batch {args.micro_batch} × seq "
        f"{args.seq_len} × {t.world} × accumulation {t.accum} = {args.global_batch_tokens:,} tokens per step")
    log(f"data: {data.name}, {len(data):,} tokens; each step reads {args.global_batch_tokens / len(data):.3g} "
        f"of it | tokenizer: {data.tokenizer_name} | precision: {run.policy()} | compile: {t.compiled}"
        f" | recompute: {'on' if args.checkpoint_activations else 'off'} | "
        f"{peak_flops(t.device, args.peak_tflops)[1]}")
    sent = {k.replace("_", "-"): v for k, v in run_sent_bytes(run).items() if v}
    log(f"memory ledger (code/shapes.py) for this run on a GPU (flash attention, eager autograd): {ledger:,.0f} MiB "
        f"per device, of which weights, gradients and optimizer state {ledger_state_mib(t):,.2f} MiB | sent per "
        f"device per step: " + (", ".join(f"{k} {v / 2**20:,.2f} MiB" for k, v in sent.items()) or "nothing"))


def planned_run(args, world: int, accum: int, precision: str) -> Run:
    """This run as the ledger (shapes.Run) describes it: what the ledger, the budget and the start line count."""
    sharded = args.shard in ("fsdp", "hsdp") and world > 1
    scheme = ("ddp" if not sharded else args.shard if args.shard == "hsdp" else
              "zero3" if args.reshard_after_forward else "zero2")
    shape = Shape(args.d_model, args.n_layer, args.n_head, args.seq_len, args.micro_batch, args.vocab_size)
    return Run(shape, gpus=world, scheme=scheme, precision=precision, accum=accum,
               sync_every=args.grad_sync == "every", checkpoint=args.checkpoint_activations,
               shard_size=args.shard_size if scheme == "hsdp" else None,
               gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def ledger_mib(run: Run, n_params: int) -> float:
    """The memory ledger's peak per GPU for this run, in MiB (memory.run_peak_bytes: GPU kernels)."""
    return run_peak_bytes(run, n_params)["total"] / 2**20


def ledger_state_mib(t: Trainer) -> float:
    """What the ledger says one process holds of weights, gradients and optimizer state (fp32 here)."""
    state = run_state_bytes(planned_run(t.args, t.world, t.accum, t.precision), t.raw.num_params())
    return sum(state[k] for k in ("weights", "grads", "optimizer")) / 2**20


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


if __name__ == "__main__":
    main()
