"""train_gpu.py's record of a run, kept by rank 0: the console, OUT/run.json and OUT/log.jsonl.

run.json: command line, arguments, git commit, devices, versions, start, end and exit status, with
the records of the interrupted runs a resumed one continues (rewritten atomically). log.jsonl: one
JSON line per log step, fsynced; on resume the lines after the checkpoint's step are dropped, since
the resumed run logs those steps again.
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
from script_support import append_jsonl, atomic_write, write_json

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
        "start": now(), "end": None, "exit_code": None,
    }


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


class RunLog:
    """Rank 0's record of the run: the console, OUT/run.json and OUT/log.jsonl; silent on other ranks.
    RunLog.current is this process's log of the run in progress until it ends: train_gpu.main records
    the status of a run that stops by an exception (a failed save, out of memory) with end_current."""
    current = None

    def __init__(self, args, device, rank: int, world: int, precision: str, start: int):
        RunLog.current = self
        self.out, self.master, self.record = Path(args.out), rank == 0, None
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
            keep_log_lines(self.out / LOG_NAME, start)

    def __call__(self, *a):
        if self.master:
            print(*a, flush=True)

    def jsonl(self, entry: dict) -> None:
        if self.master:
            append_jsonl(self.out / LOG_NAME, {**entry, "time": now()})

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
