"""train_gpu.py on a CPU: the logic readers take to a GPU box, run as a smoke test."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from data import REPO

SCRIPT = str(REPO / "code" / "train_gpu.py")
TINY = ["--device", "cpu", "--d-model", "32", "--n-layer", "2", "--n-head", "2", "--seq-len", "32",
        "--lr", "3e-3", "--warmup", "4", "--log-every", "4"]
STEPS = 16
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def run(args, nproc=1, timeout=180, check=True):
    launcher = [sys.executable, SCRIPT] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", SCRIPT]
    r = subprocess.run(launcher + args, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def load(path):
    return torch.load(path / "ckpt.pt", weights_only=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 1-process run: micro-batch 4 × 32 tokens, 2 accumulation steps."""
    out = tmp_path_factory.mktemp("ref")
    r = run(TINY + ["--micro-batch", "4", "--global-batch-tokens", "256", "--steps", str(STEPS),
                    "--save-every", "4", "--out", str(out)])
    return out, r.stdout


def test_smoke_run_logs_and_learns(reference):
    out, stdout = reference
    assert "accumulation 2 = 256 tokens per step" in stdout
    assert "no MFU on CPU" in stdout and "MFU " not in stdout.replace("no MFU", "")
    losses = [float(line.split("loss ")[1].split()[0]) for line in stdout.splitlines() if line.startswith("step")]
    assert len(losses) == STEPS // 4 and losses[-1] < losses[0] - 0.05, losses
    ck = load(out)
    assert ck["step"] == STEPS and ck["world_size"] == 1
    assert {"model", "optimizer", "sampler_rng", "cpu_rng"} <= set(ck)


def test_two_processes_match_one(reference, tmp_path):
    """2 gloo processes × micro-batch 2 see the same rows as 1 process × 4: same parameters."""
    r = run(TINY + ["--micro-batch", "2", "--global-batch-tokens", "256", "--steps", str(STEPS),
                    "--save-every", "0", "--out", str(tmp_path)], nproc=2)
    assert "2 process(es)" in r.stdout and "accumulation 2" in r.stdout
    ref, two = load(reference[0])["model"], load(tmp_path)["model"]
    diff = max((ref[k] - two[k]).abs().max().item() for k in ref)
    assert diff < 1e-5, diff  # float summation order only


def test_kill_9_then_resume_is_bitwise_identical(reference, tmp_path):
    args = TINY + ["--micro-batch", "4", "--global-batch-tokens", "256", "--steps", str(STEPS),
                   "--save-every", "4", "--out", str(tmp_path)]
    proc = subprocess.Popen([sys.executable, SCRIPT] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=ENV, cwd=REPO)
    deadline = time.time() + 120
    while not (tmp_path / "ckpt.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "no checkpoint before the run ended"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = load(tmp_path)["step"]
    assert proc.returncode == -signal.SIGKILL and killed_at < STEPS
    r = run(args + ["--resume"])
    assert f"resumed from ckpt.pt at step {killed_at}" in r.stdout
    ref, resumed = load(reference[0]), load(tmp_path)
    assert resumed["step"] == STEPS
    for k in ref["model"]:
        assert torch.equal(ref["model"][k], resumed["model"][k]), k
    for i, st in ref["optimizer"]["state"].items():
        for name in st:
            assert torch.equal(st[name], resumed["optimizer"]["state"][i][name]), (i, name)


def test_nan_stops_with_last_good_checkpoint(tmp_path):
    r = run(TINY + ["--micro-batch", "2", "--steps", "12", "--save-every", "4", "--inject-nan-at", "6",
                    "--out", str(tmp_path)], check=False)
    assert r.returncode == 3
    assert "NaN/inf at or before step 8" in r.stdout and "Traceback" not in r.stderr
    ck = load(tmp_path)
    assert ck["step"] == 4 and all(torch.isfinite(v).all() for v in ck["model"].values())


def test_memmap_token_file(tmp_path):
    ids = np.random.default_rng(0).integers(0, 8192, size=20_000, dtype=np.uint16)
    ids.tofile(tmp_path / "tokens.bin")
    r = run(TINY + ["--micro-batch", "2", "--steps", "4", "--data", str(tmp_path / "tokens.bin"),
                    "--out", str(tmp_path / "run")])
    assert "tokens.bin (uint16 memmap), 20,000 tokens" in r.stdout
    np.array([1, 9000], dtype=np.uint16).tofile(tmp_path / "bad.bin")
    r = run(TINY + ["--data", str(tmp_path / "bad.bin"), "--out", str(tmp_path / "run2")], check=False)
    assert r.returncode == 1 and "token id 9000" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_no_cuda_is_one_sentence(tmp_path):
    r = run(["--out", str(tmp_path)], check=False)  # the default device is cuda
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "no CUDA GPU" in r.stderr and "Traceback" not in r.stderr


def test_argument_errors(tmp_path):
    from train_gpu import main
    with pytest.raises(SystemExit) as e:
        main(TINY + ["--micro-batch", "4", "--global-batch-tokens", "1000", "--out", str(tmp_path)])
    assert "not a positive multiple of micro-batch × seq-len × processes = 4 × 32 × 1 = 128" in str(e.value.code)
    with pytest.raises(SystemExit) as e:
        main(TINY + ["--resume", "--out", str(tmp_path)])
    assert "no checkpoint" in str(e.value.code)
    (tmp_path / "ckpt.pt").write_bytes(b"")
    with pytest.raises(SystemExit) as e:
        main(TINY + ["--out", str(tmp_path)])
    assert "exists; pass --resume" in str(e.value.code)


def test_activation_checkpointing_keeps_the_parameters(reference, tmp_path):
    """Recomputing each block in backward changes the memory, not the arithmetic: same parameters."""
    r = run(TINY + ["--micro-batch", "4", "--global-batch-tokens", "256", "--steps", str(STEPS),
                    "--save-every", "0", "--checkpoint-activations", "--out", str(tmp_path)])
    assert "activation checkpointing: on" in r.stdout and "activation checkpointing: off" in reference[1]
    assert "ledger" not in r.stdout and "peak mem" not in r.stdout  # the memory lines are for CUDA only
    ref, ckpt = load(reference[0])["model"], load(tmp_path)["model"]
    for k in ref:  # the recomputation repeats the same operations: bitwise equal
        assert torch.equal(ckpt[k], ref[k]), k


def test_checkpointing_a_model_without_layers_is_refused(tmp_path):
    r = run(TINY + ["--n-layer", "0", "--checkpoint-activations", "--out", str(tmp_path / "run")], check=False)
    assert r.returncode == 1 and r.stderr.strip() == "error: --n-layer must be positive, got 0"
    assert not (tmp_path / "run").exists()  # refused before any work
    from train_gpu import main
    with pytest.raises(SystemExit) as e:
        main(TINY + ["--n-head", "3", "--out", str(tmp_path / "run")])  # 32 / 3: no traceback from GPTConfig
    assert "must split into --n-head 3 heads" in str(e.value.code)


def test_ledger_prediction_matches_the_memory_module():
    from memory import Shape, step_bytes
    from train_gpu import build_parser, ledger_mib
    args = build_parser().parse_args(TINY + ["--checkpoint-activations"])
    shape = Shape(32, 2, 2, 32, args.micro_batch, args.vocab_size)
    want = step_bytes(shape, 300_000, gpus=2, checkpoint=True)["total"] / 2**20
    assert ledger_mib(args, 300_000, 2) == want
    assert ledger_mib(args, 300_000, 2) < ledger_mib(build_parser().parse_args(TINY), 300_000, 2)
