"""Faults injected into train_gpu.py for the tests, by monkeypatching: nothing of this is on the
reader's path. `python tests/train_gpu_faults.py ARGS` (also under torchrun) runs train_gpu.main with
the faults named in the environment variable TRAIN_GPU_FAULTS, `nan=STEP,inf=STEP,stop=STEP,sleep=MS,
hang=STEP,stall=STEP,oom=STEP,stale=1,env=1,slow_export=S,bucket=1,early_signal=1`: a NaN loss from STEP on (what a
diverging run shows); an inf gradient at STEP on rank 0 of an fp16 run (what an fp16 overflow leaves); a
stop request on the last rank at STEP (what a SIGTERM does); MS milliseconds of sleep per step (time for a
test to send a real signal); the last rank stuck after STEP (a hung peer; its peers wait in the stop poll's
all-reduce on the default group); the last rank stuck at the start of step STEP (its peers wait in HSDP's
all-gathers and all-reduce, on the DeviceMesh's groups); torch.OutOfMemoryError in step STEP on the last
rank (what an allocation that does not fit raises); the last rank not seeing the newest checkpoint in --out
(a bucket mount still syncing); each process printing TORCH_NCCL_ASYNC_ERROR_HANDLING as it joins; rank
0's write of model.pt taking S seconds more (slow storage); --out refusing what an S3 bucket mounted by
goofys refuses (bucket_rules); a SIGTERM to the process while it loads the data, before training.
In-process tests call install(spec, monkeypatch.setattr)."""
import builtins
import errno
import io
import os
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "code"))
import train_gpu  # noqa: E402


def parse(spec: str) -> dict:
    return {k: int(v) for k, v in (item.split("=") for item in spec.split(","))} if spec else {}


def install(spec: str, setattr=setattr) -> None:
    faults = parse(spec)
    train_step, agreed = train_gpu.train_step, train_gpu.StopFlag.agreed
    unscale = torch.amp.grad_scaler.GradScaler.unscale_  # the class: a test may replace torch.amp.GradScaler
    current = {}

    def faulty_train_step(t, step):
        current.update(t=t, step=step)
        if faults.get("stall") == step + 1 and t.rank == t.world - 1:
            time.sleep(3 * train_gpu.step_timeout(t.args))  # past the timeout, before this step's gathers
        if faults.get("oom") == step + 1 and t.rank == t.world - 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        loss, norm = train_step(t, step)
        if "nan" in faults and step + 1 >= faults["nan"]:
            loss = loss * float("nan")
        return loss, norm

    def faulty_unscale(scaler, opt):  # after the step's backward, before the scaler looks for infs
        t = current["t"]
        if faults.get("inf") == current["step"] + 1 and t.rank == 0:
            g = next(t.raw.parameters()).grad
            (g.to_local() if hasattr(g, "to_local") else g).view(-1)[0] = float("inf")
        return unscale(scaler, opt)

    def faulty_agreed(self, t, done, poll):
        if faults.get("sleep"):
            time.sleep(faults["sleep"] / 1000)
        if faults.get("stop") == done and t.rank == t.world - 1:
            self.signum = signal.SIGTERM
        if faults.get("hang") == done and t.rank == t.world - 1:
            time.sleep(3 * train_gpu.step_timeout(t.args))  # past the timeout
        return agreed(self, t, done, poll)

    def stale_checkpoints(out):
        found = complete_checkpoints(out)
        last_rank = int(os.environ.get("RANK", 0)) == int(os.environ.get("WORLD_SIZE", 1)) - 1
        return found[:-1] if last_rank else found

    def joining(*a, **k):
        print(f"rank {os.environ.get('RANK', 0)} joins with TORCH_NCCL_ASYNC_ERROR_HANDLING="
              f"{os.environ.get('TORCH_NCCL_ASYNC_ERROR_HANDLING')}", flush=True)
        return process_group(*a, **k)

    def slow_save(obj, path):
        time.sleep(faults["slow_export"])
        return save_atomic(obj, path)

    def signalled_while_loading(*a, **k):  # a preemption notice that arrives before training starts
        os.kill(os.getpid(), signal.SIGTERM)
        return token_source(*a, **k)

    token_source = train_gpu.TokenSource
    if faults.get("early_signal"):
        setattr(train_gpu, "TokenSource", signalled_while_loading)
    process_group, save_atomic = train_gpu.process_group, train_gpu.checkpoint.save_atomic
    if faults.get("env"):
        setattr(train_gpu, "process_group", joining)
    if faults.get("slow_export"):
        setattr(train_gpu.checkpoint, "save_atomic", slow_save)
    if faults.get("bucket"):
        bucket_rules(train_gpu.build_parser().parse_known_args()[0].out, setattr)
    complete_checkpoints = train_gpu.complete_checkpoints
    if faults.get("stale"):
        setattr(train_gpu, "complete_checkpoints", stale_checkpoints)
    setattr(train_gpu, "train_step", faulty_train_step)
    setattr(torch.amp.grad_scaler.GradScaler, "unscale_", faulty_unscale)
    setattr(train_gpu.StopFlag, "agreed", faulty_agreed)


def bucket_rules(root, setattr=setattr) -> None:
    """Under the folder `root`, refuse what goofys (SkyPilot's MOUNT of S3) refuses, with its error: an
    append, and opening an existing file to change it in place (r+, O_RDWR or O_WRONLY without O_TRUNC).
    A file written from its start (created or truncated), read, renamed or removed passes, as on goofys
    (kahing/goofys README: "only sequential writes supported", appending not implemented; it renames files).
    What it cannot see: a seek backwards while writing, and files that C code opens (DCP and torch.save
    write through Python file objects)."""
    root = os.path.realpath(root)
    real_open, real_os_open = builtins.open, os.open

    def under(path) -> bool:
        return isinstance(path, (str, bytes, os.PathLike)) and \
            os.path.realpath(os.fsdecode(path)).startswith(root + os.sep)

    def refused(path):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported (an object-store mount: no appends, no in-place "
                      "writes)", os.fsdecode(path))

    def checked_open(file, mode="r", *a, **k):
        if under(file) and ("a" in mode or ("+" in mode and "w" not in mode)):
            refused(file)
        return real_open(file, mode, *a, **k)

    def checked_os_open(path, flags, *a, **k):
        changes = flags & os.O_ACCMODE != os.O_RDONLY and not flags & os.O_TRUNC and os.path.exists(path)
        if under(path) and (flags & os.O_APPEND or changes):
            refused(path)
        return real_os_open(path, flags, *a, **k)

    setattr(builtins, "open", checked_open)
    setattr(io, "open", checked_open)  # pathlib.Path.open calls io.open
    setattr(os, "open", checked_os_open)


if __name__ == "__main__":
    install(os.environ.get("TRAIN_GPU_FAULTS", ""))
    train_gpu.main()
