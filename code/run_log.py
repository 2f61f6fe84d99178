"""train_gpu.py's record of a run, kept by rank 0 (RunLog): the console, OUT/run.json (command line,
arguments, git commit, devices, versions, start, end and exit status, with the records of the
interrupted runs a resumed one continues) and OUT/log.jsonl (one JSON line per log step; on resume the
lines after the checkpoint's step are dropped, since the resumed run logs those steps again). Both are
written whole and renamed, never appended to: goofys (S3) writes only from a file's start, and renames.
"""
import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import torch

from record import git_state
from script_support import atomic_write, write_json

LOG_NAME = "log.jsonl"
RECORD_NAME = "run.json"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
        "nccl_async_error_handling": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"),  # what a hang ends in
        "start": now(), "end": None, "exit_code": None,
        # the launcher's name for this try (launch/slurm.sbatch: job and restart), so that it requeues only on
        # a status this try recorded, never on one an earlier try left
        "attempt": os.environ.get("TRAIN_ATTEMPT"),
    }


def kept_log_lines(path: Path, last_step: int) -> list:
    """The log lines of steps up to last_step (where a resumed run continues): lines a killed run wrote
    after its last checkpoint are logged again by the resumed run."""
    kept = []
    if last_step and path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line)["step"] <= last_step:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                break  # a line cut by the kill: nothing after it is whole
    return kept


class RunLog:
    """Rank 0's record of the run: the console, OUT/run.json and OUT/log.jsonl; silent on other ranks.
    RunLog.current is this process's log of the run in progress until it ends: train_gpu.main records
    the status of a run that stops by an exception (a failed save, out of memory) with end_current."""
    current = None

    def __init__(self, args, device, rank: int, world: int, precision: str, start: int):
        RunLog.current = self
        self.out, self.master, self.record, self.lines = Path(args.out), rank == 0, None, []
        if self.master:
            self.record = run_record(args, device, world, precision)
            earlier = []
            if start and (self.out / RECORD_NAME).is_file():  # keep what the interrupted runs recorded
                try:
                    old = json.loads((self.out / RECORD_NAME).read_text(encoding="utf-8"))
                    earlier = old.pop("earlier_runs", []) + [old]
                except (OSError, ValueError, AttributeError):
                    pass
            self.record.update(resumed_from_step=start or None, earlier_runs=earlier)
            write_json(self.out / RECORD_NAME, self.record)
            self.lines = kept_log_lines(self.out / LOG_NAME, start)
            self._write_lines()

    def __call__(self, *a):
        if self.master:
            print(*a, flush=True)

    def jsonl(self, entry: dict) -> None:
        if self.master:
            self.lines.append(json.dumps({**entry, "time": now()}, ensure_ascii=False) + "\n")
            self._write_lines()

    def _write_lines(self) -> None:
        with atomic_write(self.out / LOG_NAME) as f:
            f.write("".join(self.lines).encode("utf-8"))

    def end(self, exit_code: int) -> None:
        if RunLog.current is self:
            RunLog.current = None
        if self.master:
            self.record.update(end=now(), exit_code=exit_code)
            write_json(self.out / RECORD_NAME, self.record)


def end_current(exit_code: int) -> None:
    """Record `exit_code` as the end of the run in progress in this process, if one has started and not ended."""
    if RunLog.current is not None:
        RunLog.current.end(exit_code)
