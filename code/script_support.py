"""What the training scripts share, written once so that every script behaves the same way.

- Parser, number, positive, positive_int, fail: re-exported from arguments.py, which holds them
  without torch (budget.py runs in the browser with them).
- atomic_write, save_atomic: write to NAME.tmp, fsync, rename over NAME. A run killed at any
  moment leaves the old file or the new one, never half of one; an error while writing removes
  the temporary file and leaves the old file as it was. Checkpoints and token files both need this.
- Ranks, launch_ranks, process_group: the ranks torchrun gives a process, and joining and leaving
  the process group around a run. Without torchrun a script is one plain process and starts no
  group, so the same script is its own single-process reference.
- mean_across_ranks: the mean of a tensor over all processes (gloo has no ReduceOp.AVG).
- set_lr: give every parameter group of an optimizer this step's learning rate.
- run_script: run one of these scripts as a reader would, as one plain process or under
  torch.distributed.run (the chapters that start processes use it).
- accumulate_gradients: forward and backward over micro-batches whose gradients add up to the
  whole batch's, with the gradient all-reduce skipped on all but the last. The detail that is easy
  to get wrong (no_sync must enclose forward as well as backward) is written in one place for the
  chapters' scripts (ddp_train.py, fsdp_comm.py) and timing code (measure.py); train_gpu.py, the
  script a reader copies, keeps its loop inline in train_step, as nanoGPT and nanochat do.

Nothing here imports the book's other modules: model, data and training code import this, not
the other way round.
"""
import contextlib
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

# ---- command-line arguments: arguments.py (torch-free, so budget.py runs in the browser) ----
from arguments import REFUSED, Parser, fail, number, positive, positive_int  # noqa: E402,F401  (re-exported)

# ---- files that are either old or new, never half-written ----

@contextlib.contextmanager
def atomic_write(path):
    """Open a temporary file beside `path` for binary writing; when the block ends normally, flush
    it to disk and rename it to `path`. If the block raises, the temporary file is removed and
    `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the file
        os.replace(tmp, path)  # atomic: readers see the old or the new file, never half of one
    finally:
        tmp.unlink(missing_ok=True)


def save_atomic(obj, path) -> None:
    """torch.save(obj) to `path` through atomic_write."""
    with atomic_write(path) as f:
        torch.save(obj, f)


# ---- processes ----

class Ranks(NamedTuple):
    rank: int  # this process among all of them
    local_rank: int  # this process on its machine: which GPU it takes
    world: int  # number of processes


def launch_ranks() -> Ranks:
    """The ranks torchrun set in the environment; (0, 0, 1) for a process started without it."""
    return Ranks(*(int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1))))


@contextlib.contextmanager
def process_group(backend: str, timeout_s: float | None = None):
    """Join the other processes of a torchrun launch for the block, and leave at its end.

    Yields launch_ranks(); a single process starts no group. timeout_s: how long a collective
    waits for the other processes before it fails (None: torch's default). The group is left when
    the block ends or calls sys.exit, but not after an exception: after a failed collective,
    leaving can hang, and the launcher ends the other processes anyway.
    """
    ranks = launch_ranks()
    if ranks.world > 1:
        dist.init_process_group(backend, timeout=None if timeout_s is None else timedelta(seconds=timeout_s))
    failed = False
    try:
        yield ranks
    except Exception:
        failed = True
        raise
    finally:
        if ranks.world > 1 and not failed:
            dist.destroy_process_group()


def mean_across_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise mean of `tensor` over all processes, in place (and returned).

    In a single process (no group) the tensor is returned unchanged. NCCL averages in one
    all-reduce; gloo has no ReduceOp.AVG, so it sums and divides."""
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    if dist.get_backend() == dist.Backend.NCCL:
        dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
    else:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= dist.get_world_size()
    return tensor


# ---- one optimizer step ----

def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Give every parameter group of `opt` the learning rate `lr`."""
    for group in opt.param_groups:
        group["lr"] = lr


def accumulate_gradients(model, micro_batches, no_sync=None, autocast_dtype=None) -> torch.Tensor:
    """Forward and backward over the micro-batches [(x, y), ...]; return their mean loss (detached).

    Each loss is divided by the number of micro-batches, so the gradients backward() adds up are
    those of the mean loss over the whole batch. no_sync: a function that returns a context in
    which the gradient all-reduce is skipped (DDP's model.no_sync), or None for one process. It
    encloses forward AND backward of every micro-batch but the last, because DDP decides during
    forward whether the following backward all-reduces. autocast_dtype: None for fp32, or e.g.
    torch.bfloat16 for mixed precision (the weights and gradients stay fp32).
    """
    n = len(micro_batches)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == n - 1
        sync = contextlib.nullcontext() if last or no_sync is None else no_sync()
        autocast = (contextlib.nullcontext() if autocast_dtype is None
                    else torch.autocast(x.device.type, dtype=autocast_dtype))
        with sync:  # forward inside too: DDP prepares the all-reduce during forward
            with autocast:
                _, loss = model(x, y)
            (loss / n).backward()  # summed over micro-batches: the gradient of the mean loss
        total = total + loss.detach() / n
    return total


# ---- starting a script the way a reader does ----

def run_script(script, args, nproc: int | None = None, cwd=None, env=None, check: bool = True,
               timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run `python SCRIPT ARGS`, or with nproc, `python -m torch.distributed.run --standalone
    --nproc-per-node=NPROC SCRIPT ARGS`: what a reader types, with this interpreter (the `torchrun`
    command need not be on PATH in a notebook). env defaults to one thread per process
    (OMP_NUM_THREADS=1: the processes share the cores; it also silences torchrun's banner).
    Returns the finished process with its output and .seconds, its wall time; with check, a
    non-zero exit raises RuntimeError with the end of its stderr."""
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if env is None else env
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *launcher, str(script), *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout_s)
    p.seconds = time.perf_counter() - t0
    if check and p.returncode != 0:
        raise RuntimeError(f"{Path(script).name} exited with {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    return p


# ---- fp16 loss scaling, output paths, run logs, sampling ----

class ScaledLoss:
    """model(x, y) with the loss multiplied by a GradScaler's scale, for accumulate_gradients.

    fp16 gradients below ~6e-8 round to zero; scaling the loss (by a power of two) lifts them into
    range, and scaler.unscale_/step divide it out again (and skip the step if a gradient overflowed).
    The unscaled losses are kept in .losses, so the log shows the real loss without a device sync."""

    def __init__(self, model, scaler):
        self.model, self.scaler, self.losses = model, scaler, []

    def __call__(self, x, y):
        logits, loss = self.model(x, y)
        self.losses.append(loss.detach())
        return logits, self.scaler.scale(loss)

    def mean_loss(self) -> torch.Tensor:
        """The mean unscaled loss of the micro-batches since the last call; forgets them."""
        mean = torch.stack(self.losses).mean()
        self.losses = []
        return mean


def output_problem(path, kind: str = "file") -> str | None:
    """Why `path` cannot be written as an output `kind` ("file" or "dir"), or None if it can.

    Checked before any long work: a path that is a directory (for a file) or a file (for a
    directory), one under an existing file, or one whose nearest existing folder is not writable."""
    path = Path(path)
    if kind == "file" and path.is_dir():
        return f"{path} is a directory, not a file"
    if kind == "dir" and path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    parent = path if kind == "dir" else path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{path} lies under {parent}, which is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{path} cannot be written: {parent} is not writable"
    if kind == "file" and path.exists() and not os.access(path, os.W_OK):
        return f"{path} exists and is not writable"
    return None


def write_json(path, record: dict) -> None:
    """Write `record` as JSON through atomic_write: the old file or the new one, never half of one."""
    import json
    with atomic_write(path) as f:
        f.write(json.dumps(record, ensure_ascii=False, indent=1, default=str).encode("utf-8") + b"\n")


@torch.no_grad()
def generate(model, idx: torch.Tensor, n_new: int, temperature: float = 0.8, generator=None,
             context: int | None = None, kv_cache: bool = False) -> torch.Tensor:
    """Extend the token ids idx (batch, t) by n_new sampled tokens; return (batch, t + n_new).

    model(idx) must return (logits, _). temperature 0 is greedy; otherwise sample from
    softmax(logits / temperature) with `generator` (a CPU torch.Generator, for repeatable samples).
    context: the longest input the model takes (its seq_len); older tokens are dropped.
    kv_cache: keep each block's keys and values (model.KVCache; the book's GPT only), so that each new
    token runs the model on itself alone; where the context is full, the cache starts again from the
    last context tokens. Without it, every new token runs the model over the whole context again."""
    from model import KVCache
    was_training = model.training
    model.eval()
    cache, logits = None, None
    for _ in range(n_new):
        window = idx if context is None else idx[:, -context:]
        if not kv_cache:
            logits, _ = model(window)
        elif cache is None or len(cache) >= (context or model.cfg.seq_len):
            cache = KVCache(len(model.blocks))  # the prompt, or a full context: fill the cache anew
            logits, _ = model(window, cache=cache)
        else:
            logits, _ = model(idx[:, -1:], cache=cache)
        last = logits[:, -1, :].float()
        if temperature == 0:
            nxt = last.argmax(-1, keepdim=True)
        else:
            probs = torch.softmax(last / temperature, dim=-1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).to(idx.device)
        idx = torch.cat([idx, nxt], dim=1)
    model.train(was_training)
    return idx
