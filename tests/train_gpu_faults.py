"""Faults injected into train_gpu.py for the tests, by monkeypatching: nothing of this is on the
reader's path. `python tests/train_gpu_faults.py ARGS` (also under torchrun) runs train_gpu.main with
the faults named in the environment variable TRAIN_GPU_FAULTS, `nan=STEP,inf=STEP,stop=STEP,sleep=MS,
hang=STEP,oom=STEP,stale=1`: a NaN loss from STEP on (what a diverging run shows); an inf gradient at STEP
on rank 0 of an fp16 run (what an fp16 overflow leaves); a stop request on the last rank at STEP (what a SIGTERM does);
MS milliseconds of sleep per step (time for a test to send a real signal); the last rank stuck after STEP
(a hung peer); torch.OutOfMemoryError in step STEP on the last rank (what an allocation that does not
fit raises); the last rank not seeing the newest checkpoint in --out (a bucket mount still syncing).
In-process tests call install(spec, monkeypatch.setattr)."""
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

    complete_checkpoints = train_gpu.complete_checkpoints
    if faults.get("stale"):
        setattr(train_gpu, "complete_checkpoints", stale_checkpoints)
    setattr(train_gpu, "train_step", faulty_train_step)
    setattr(torch.amp.grad_scaler.GradScaler, "unscale_", faulty_unscale)
    setattr(train_gpu.StopFlag, "agreed", faulty_agreed)


if __name__ == "__main__":
    install(os.environ.get("TRAIN_GPU_FAULTS", ""))
    train_gpu.main()
