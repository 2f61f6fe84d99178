"""launch/slurm.sbatch submitted as it is to a real two-node Slurm cluster on this machine
(tests/slurm_cluster.py): 2 nodes × 2 processes on the CPU (gloo), a tiny model.

Only what a reader changes through sbatch's options and the environment differs from a GPU cluster: the node's
GPUs and CPUs (--gpus-per-node=0 --cpus-per-task=1), NPROC_PER_NODE, TRAIN_ARGS (--device cpu and the tiny
shape), OUT, VENV (this repository's, which has the pins: the install step checks it and changes nothing),
--time, --signal and the log file. Every job's record comes from the controller (`scontrol show job`:
state, restarts, exit code) and from run.json.

What these tests cannot see: GPUs and NCCL (gloo on one machine's loopback), a node whose machine goes away
(a killed job step stands for it), and the shared file system of a real cluster (both nodes see this
machine's disk; a node-local disk is a tmpfs in each slurmd's mount namespace)."""
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from slurm_cluster import Cluster, why_not

REPO = Path(__file__).resolve().parent.parent
SBATCH = REPO / "launch" / "slurm.sbatch"
STEPS, SAVE_EVERY = 200, 50
TRAIN_ARGS = ("--device cpu --d-model 32 --n-layer 2 --n-head 2 --seq-len 32 --micro-batch 2 "
              "--global-batch-tokens 256 --lr 1e-3 --warmup 2 --timeout-s 60 --sample-tokens 0 --log-every 1 "
              f"--steps {STEPS} --save-every {SAVE_EVERY}")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
JOBS = []  # (test, job, state, restarts, exit code, run.json's status, bitwise): the table for the report
SUBMITTED = []  # every job, cancelled after each test (a job that loops must not outlive its test)


@pytest.fixture(scope="session")
def cluster(request):
    """One cluster for every test here, ended after the last one even when a test fails."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    c = Cluster()
    try:  # a start that fails half-way still stops what it started
        c.start()
        c.probe_ticks()
        yield c
    finally:
        c.stop()
        for row in JOBS:
            print("\nslurm job |", " | ".join(map(str, row)), end="")
        if request.session.testsfailed:
            print(f"\nthe cluster's configuration and logs: {c.root}")
        else:
            shutil.rmtree(c.root, ignore_errors=True)


@pytest.fixture(autouse=True)
def cancel_left_jobs(request):
    yield
    if SUBMITTED and "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").run(["scancel", *SUBMITTED], check=False)
        SUBMITTED.clear()


def submit(cluster, out: Path, *options, train_args=TRAIN_ARGS, logs: Path = None) -> str:
    """sbatch launch/slurm.sbatch itself, with a reader's options and environment for this machine; the
    job's log goes to LOGS/NAME-JOB.log (default: beside OUT)."""
    logs = logs or out.parent
    env = {"NPROC_PER_NODE": "2", "TRAIN_ARGS": train_args, "OUT": str(out), "VENV": str(REPO / ".venv"),
           "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}  # as with the venv activated
    job = cluster.sbatch(["--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=30",
                          f"--output={logs / (out.name + '-%j.log')}", *options, str(SBATCH)], env=env, cwd=REPO)
    SUBMITTED.append(job)
    return job


def final(cluster, job: str, timeout=600, restarts=None) -> dict:
    """The job once it has ended, or once it was requeued more than `restarts` times (a loop)."""
    return cluster.wait_for(job, lambda j: j["JobState"] in FINAL or (
        restarts is not None and int(j.get("Restarts", 0)) > restarts), timeout)


def requeued(cluster, job: str, timeout=400) -> dict:
    """The job once it waits again after a requeue (Restarts 1, PENDING, not started), or has ended."""
    return cluster.wait_for(job, lambda j: j["JobState"] in FINAL and j.get("Restarts") == "0" or (
        int(j.get("Restarts", 0)) >= 1 and j["JobState"] == "PENDING"), timeout, start_requeued=False)


def log_of(out: Path, job: str, logs: Path = None) -> str:
    return ((logs or out.parent) / f"{out.name}-{job}.log").read_text(errors="replace")


def record(out: Path) -> dict:
    return json.loads((out / "run.json").read_text(encoding="utf-8"))


def weights(out: Path) -> dict:
    return torch.load(out / "model.pt", weights_only=True)


def bitwise(a: Path, b: Path) -> bool:
    if not (a / "model.pt").is_file() or not (b / "model.pt").is_file():
        return False
    x, y = weights(a), weights(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def logged_steps(out: Path) -> list:
    path = out / "log.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def wait_for_step(cluster, job, out: Path, step: int, timeout=300) -> float:
    """Wait until the run has logged `step`; when it did (time.time())."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(x.get("step", 0) >= step for x in logged_steps(out)):
            return time.time()
        j = cluster.job(job)
        assert j["JobState"] in ("PENDING", "RUNNING", "CONFIGURING"), (j, log_of(out, job))
        time.sleep(0.2)
    raise TimeoutError(f"job {job} did not log step {step} in {timeout} s")


def note(test, job, j, out, same=None):
    status = record(out).get("exit_code") if (out / "run.json").is_file() else None
    JOBS.append((test, job, j["JobState"], j.get("Restarts"), j.get("ExitCode"), status, same))


def stamp(iso: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(iso).timestamp()


@pytest.fixture(scope="session")
def uninterrupted(cluster, tmp_path_factory):
    """The run to its end, the reference of every resumed run: (out, job, its record, seconds from sbatch
    to its first step, seconds of training)."""
    out = tmp_path_factory.mktemp("slurm") / "whole"
    t = time.time()
    job = submit(cluster, out)
    j = final(cluster, job)
    note("run to its end", job, j, out)
    steps = logged_steps(out)
    times = [stamp(x["time"]) for x in steps if "train_loss" in x] or [t]
    return out, job, j, times[0] - t, times[-1] - times[0]


def test_a_run_to_its_end(uninterrupted):
    out, job, j, *_ = uninterrupted
    log = log_of(out, job)
    assert j["JobState"] == "COMPLETED" and j["Restarts"] == "0", (j, log)
    r = record(out)
    assert r["exit_code"] == 0 and r["processes"] == 4 and r["nodes"] == 2, log
    assert (out / "model.pt").is_file()


def test_the_time_limit_saves_requeues_and_resumes_bitwise(cluster, uninterrupted, tmp_path):
    """--time=2 and --signal=USR1@N as a reader sets them: slurmctld sends USR1 to the job's steps at its
    check of time limits (every 30 s), torchrun forwards it, the workers save and record 75, the file
    requeues the job, and restart 1 resumes and ends bitwise equal to the uninterrupted run. The test
    submits at a moment chosen so that the check that sends the signal falls in the middle of training
    (the uninterrupted run's times; the moment of slurmctld's checks is measured by Cluster.probe_ticks);
    the requeued job gets a longer limit (scontrol update), since this
    tiny run would otherwise be signalled again at the same point."""
    whole, _, _, startup, training = uninterrupted
    for attempt in range(3):  # a job that starts faster or slower than the estimate misses: aim again
        aim = startup + training / 2  # seconds from sbatch to the signal
        tick = cluster.next_tick(time.time() + aim + 1)
        time.sleep(max(0.0, tick - aim - time.time()))
        lead = int(120 - aim + 10)  # the warning is due 10 s before that check, and not at the one before
        out = tmp_path / f"limit{attempt}"
        sent = time.time()
        job = submit(cluster, out, "--time=2", f"--signal=USR1@{lead}")
        j = requeued(cluster, job)
        if j["Restarts"] == "1":
            break
        note("time limit: missed the training", job, j, out)
        times = [stamp(x["time"]) for x in logged_steps(out) if "train_loss" in x]
        startup, training = (times[0] - sent, times[-1] - times[0]) if times else (aim + 10, training)
    first = log_of(out, job)
    assert j["Restarts"] == "1" and record(out)["exit_code"] == 75, (j, first)
    assert "stopped by SIGUSR1" in first and "requeueing job" in first, first
    cluster.run(cluster.sudo + ["scontrol", "update", f"JobId={job}", "TimeLimit=5"])  # an admin's right
    j = final(cluster, job)
    same = bitwise(out, whole)
    note("time limit", job, j, out, same)
    log = log_of(out, job)
    assert j["JobState"] == "COMPLETED" and j["Restarts"] == "1", (j, log)
    r = record(out)
    assert r["exit_code"] == 0 and r["attempt"].endswith("restart 1") and r["earlier_runs"][-1]["exit_code"] == 75
    assert "resumed from step_" in log and same, log


def test_a_preemption_by_the_scheduler_resumes_bitwise(cluster, uninterrupted, tmp_path):
    """scontrol requeue, as Slurm preempts a job with PreemptMode=REQUEUE: SIGTERM to every process of the
    job, KillWait (10 s here, 30 s by default) before SIGKILL, and Slurm requeues the job itself. The workers
    save and record 75 in that time; restart 1 resumes and ends bitwise equal to the uninterrupted run."""
    whole = uninterrupted[0]
    out = tmp_path / "preempted"
    job = submit(cluster, out)
    wait_for_step(cluster, job, out, 60)
    cluster.run(["scontrol", "requeue", job])
    requeued(cluster, job)
    j = final(cluster, job)
    same = bitwise(out, whole)
    note("preemption (scontrol requeue)", job, j, out, same)
    log = log_of(out, job)
    r = record(out)
    assert j["JobState"] == "COMPLETED" and j["Restarts"] == "1", (j, log)
    assert r["exit_code"] == 0 and r["earlier_runs"][-1]["exit_code"] == 75, log
    assert "stopped by SIGTERM" in log and "resumed from step_" in log and same, log


def test_a_requeued_job_that_fails_before_training_is_not_requeued_again(cluster, tmp_path):
    """C4. A job stopped with 75 requeues itself; its newest checkpoint is damaged while it waits, so
    restart 1 refuses it before training: the job ends and says why, instead of finding the 75 of
    restart 0 and requeueing itself forever. Then a new job on the same OUT with a bad argument (which
    fails before train_gpu.py records anything): it ends too, not requeued."""
    out = tmp_path / "damaged"
    job = submit(cluster, out)
    wait_for_step(cluster, job, out, 5)
    cluster.run(["scancel", "--signal=USR1", job])  # to the job's steps, as --signal does
    requeued(cluster, job)
    assert record(out)["exit_code"] == 75, log_of(out, job)
    newest = sorted((out / "checkpoints").glob("step_*"))[-1]
    shard = newest / "__0_0.distcp"
    shard.write_bytes(bytes(64) + shard.read_bytes()[64:])  # the right size, its first bytes zeroed
    j = final(cluster, job, restarts=1)
    note("C4 damaged checkpoint", job, j, out)
    log = log_of(out, job)
    assert j["JobState"] == "FAILED" and j["Restarts"] == "1", (j, log)
    assert "a shard is damaged" in log, log
    assert "recorded no status in" in log and log.rstrip().endswith("not requeued"), log

    bad = submit(cluster, out, train_args=TRAIN_ARGS + " --steps 0")
    j = final(cluster, bad, restarts=0)
    note("C4 bad argument", bad, j, out)
    log = log_of(out, bad)
    assert j["JobState"] == "FAILED" and j["Restarts"] == "0", (j, log)
    assert "--steps" in log and log.rstrip().endswith("not requeued"), log


def job_processes(job: str, step: str):
    """(process, its environment) of every process of the job's step on this machine."""
    import psutil
    for p in psutil.process_iter():
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("SLURM_JOB_ID") == job and env.get("SLURM_STEP_ID") == step:
            yield p, env


def test_a_node_lost_during_training_ends_with_its_status_and_the_checkpoint_resumes(cluster, uninterrupted,
                                                                                     tmp_path):
    """The torchrun step's processes on one node killed (the node without rank 0, whose survivor records
    the status): the other node's workers see their collective fail, rank 0 records exit 4, the job ends
    with one sentence, not requeued; a new job resumes from the checkpoint before and ends bitwise equal
    to the uninterrupted run."""
    whole = uninterrupted[0]
    out = tmp_path / "lost"
    job = submit(cluster, out)
    wait_for_step(cluster, job, out, 60)
    procs = list(job_processes(job, "1"))
    rank0 = next(env["SLURMD_NODENAME"] for _, env in procs if env.get("RANK") == "0")
    victims = [p for p, env in procs if env["SLURMD_NODENAME"] != rank0]
    assert victims, procs
    for p in victims:
        p.kill()
    j = final(cluster, job, restarts=0)
    note("node lost", job, j, out)
    log = log_of(out, job)
    assert j["JobState"] == "FAILED" and j["Restarts"] == "0", (j, log)
    assert record(out)["exit_code"] == 4 and "a collective failed" in log, log
    assert "recorded exit status 4" in log and log.rstrip().endswith("not requeued"), log
    saved = sorted(d.name for d in (out / "checkpoints").glob("step_*") if (d / ".metadata").is_file())

    again = submit(cluster, out)
    j = final(cluster, again)
    same = bitwise(out, whole)
    note("node lost: resubmitted", again, j, out, same)
    log = log_of(out, again)
    assert j["JobState"] == "COMPLETED" and f"resumed from {saved[-1]}" in log and same, log


def test_an_out_that_is_not_shared_is_refused_before_training(cluster, tmp_path):
    """C8. OUT on each node's own disk (a tmpfs in each slurmd's mount namespace): refused in one sentence
    before any step, instead of each node writing its own half of every checkpoint."""
    out = cluster.local / "run"
    job = submit(cluster, out, logs=tmp_path)
    j = final(cluster, job, restarts=0)
    log = log_of(out, job, tmp_path)
    JOBS.append(("C8 --out not shared", job, j["JobState"], j.get("Restarts"), j.get("ExitCode"), None, None))
    assert j["JobState"] == "FAILED", (j, log)
    assert "is not one folder that every process sees" in log and "step " not in log, log
