"""What a rented box gives train_gpu.py that the other tests never start it under: torchrun's own
environment (TORCH_NCCL_ASYNC_ERROR_HANDLING), HSDP's process groups with a stalled peer, a final export
slower than --step-timeout-s, and --out on a bucket that refuses appends and in-place writes.

The slow tests start the script under `python -m torch.distributed.run` on gloo processes; what NCCL does
with the variable the workers see needs a GPU and is not run here (torch's ProcessGroupNCCL.hpp: 1 tears
the process down, 2 aborts the communicator and raises). The bucket is an emulation
(tests/train_gpu_faults.py's bucket_rules: goofys' rules on Python's open), not a FUSE mount."""
import json
import time

import pytest
from test_train_gpu import RUN, TINY, checked, launch, main_here, run, slow, train_log
from together import run_together

import train_gpu


def record(out) -> dict:
    return json.loads((out / "run.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """{name: (out, the finished torchrun launch, its wall seconds)}, started together."""
    outs = {name: tmp_path_factory.mktemp(name) for name in ("env", "stall", "export")}
    env = launch(RUN + ["--micro-batch", "4", "--steps", "2", "--out", str(outs["env"])], nproc=2, faults="env=1")
    env[2].pop(train_gpu.NCCL_ERRORS_VAR, None)  # as a shell that exported nothing: torchrun writes its own
    launches = {
        # every worker prints the variable as it joins (a test hook); run.json records rank 0's
        "env": env,
        # HSDP as 2 groups of 2; the last process stuck at the start of step 4 (after the first step's timeout)
        "stall": launch(RUN + ["--shard", "hsdp", "--shard-size", "2", "--micro-batch", "2", "--step-timeout-s", "5",
                               "--out", str(outs["stall"])], nproc=4, faults="stall=4"),
        # FSDP with a sample at the end (a sharded forward: every process); model.pt written 4 s past the timeout
        "export": launch(RUN + ["--shard", "fsdp", "--micro-batch", "4", "--steps", "2", "--sample-tokens", "4",
                                "--step-timeout-s", "4", "--out", str(outs["export"])], nproc=2,
                         faults="slow_export=8"),
    }
    start = time.monotonic()
    ran = run_together(launches, timeout=150)
    return {name: (outs[name], r, time.monotonic() - start) for name, r in ran.items()}


@slow
def test_every_worker_under_torchrun_sees_the_nccl_error_mode_the_docstring_names(launched):
    """torchrun writes TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (tear down: SIGABRT, run.json null) into each worker's
    environment; the script must set 2 before the process group exists, on every worker."""
    out, r, _ = launched["env"]
    checked(r)
    seen = sorted(x for x in r.stdout.splitlines() if " joins with " in x)
    assert seen == [f"rank {i} joins with TORCH_NCCL_ASYNC_ERROR_HANDLING=2" for i in (0, 1)], r.stdout
    assert record(out)["nccl_async_error_handling"] == "2"


def test_a_value_the_user_exported_is_kept_and_torchruns_default_replaced(monkeypatch):
    for exported, used in ((None, "2"), ("1", "2"), ("3", "3"), ("0", "0")):
        if exported is None:
            monkeypatch.delenv(train_gpu.NCCL_ERRORS_VAR, raising=False)
        else:
            monkeypatch.setenv(train_gpu.NCCL_ERRORS_VAR, exported)
        assert train_gpu.nccl_error_handling() == used, exported


@slow
def test_a_stalled_peer_under_hsdp_ends_with_exit_4_within_the_step_timeout(launched):
    """The peers of the stalled process wait in HSDP's all-gathers and cross-group all-reduce, on the
    DeviceMesh's own groups, which torch creates with its default timeout (30 min on gloo): every group
    must get --step-timeout-s, so the run ends in one sentence and exit 4 within seconds."""
    out, r, seconds = launched["stall"]
    errors = [x for x in r.stderr.splitlines() if x.startswith("error: process")]
    assert errors and all("a collective failed" in x for x in errors), r.stdout[-2000:] + r.stderr[-3000:]
    assert record(out)["exit_code"] == 4 and seconds < 120, (record(out), seconds)


@slow
def test_a_slow_final_export_does_not_race_the_step_timeout(launched):
    """Rank 0 writes model.pt 8 s longer than usual, twice --step-timeout-s: the other process must not wait
    for it in a collective (the sharded sample ran before), so the run ends 0 with model.pt."""
    out, r, _ = launched["export"]
    checked(r)
    assert (out / "model.pt").is_file() and record(out)["exit_code"] == 0


def test_a_run_stopped_and_resumed_on_a_bucket_that_refuses_appends(tmp_path, monkeypatch, capsys):
    """--out under goofys' rules (SkyPilot's MOUNT of S3): no append, no file changed in place. A run that
    logs every step, stopped at step 3 (exit 75, a checkpoint) and resumed to step 6, keeps every record:
    log.jsonl once per step, run.json with the stopped run among its earlier ones, model.pt."""
    import train_gpu_faults
    out = tmp_path / "bucket" / "out"
    out.parent.mkdir()
    train_gpu_faults.bucket_rules(out.parent, monkeypatch.setattr)
    with pytest.raises(OSError):  # the emulation refuses what goofys refuses
        with open(out.parent / "x", "w") as f, open(out.parent / "x", "a"):
            f.write("")
    train_gpu_faults.install("stop=3", monkeypatch.setattr)
    args = TINY + ["--micro-batch", "8", "--steps", "6", "--log-every", "1", "--save-every", "0", "--out", str(out)]
    main_here(args, status=75)
    main_here(args + ["--resume"])
    assert "Traceback" not in capsys.readouterr().err
    assert [x["step"] for x in train_log(out)] == [1, 2, 3, 4, 5, 6]
    assert [x["exit_code"] for x in record(out)["earlier_runs"]] == [75] and record(out)["exit_code"] == 0
    assert (out / "model.pt").is_file()


@slow
def test_two_processes_under_torchrun_stop_and_resume_on_the_bucket(tmp_path):
    """The same under torchrun, 2 processes: DCP's shards from both, rank 0's record, on the emulated bucket."""
    out = tmp_path / "out"
    args = RUN + ["--micro-batch", "4", "--out", str(out)]
    r = run(args, nproc=2, check=False, faults="bucket=1,stop=3")
    assert record(out)["exit_code"] == 75, r.stdout[-2000:] + r.stderr[-2000:]
    run(args + ["--resume"], nproc=2, faults="bucket=1")
    assert [x["step"] for x in train_log(out)] == list(range(1, 9)) and (out / "model.pt").is_file()
