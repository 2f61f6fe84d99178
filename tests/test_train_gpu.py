"""train_gpu.py on a CPU: the logic readers take to a GPU box, run as a smoke test."""
import json
import os
import signal
import socket
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
    (out / "ckpt.pt.tmp").write_bytes(b"half a checkpoint")  # what a kill during a save leaves
    r = run(TINY + ["--micro-batch", "4", "--global-batch-tokens", "256", "--steps", str(STEPS),
                    "--save-every", "4", "--eval-every", "8", "--out", str(out)])
    return out, r.stdout


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """2 gloo processes × micro-batch 2 on one machine (torchrun --standalone)."""
    out = tmp_path_factory.mktemp("two")
    r = run(TINY + ["--micro-batch", "2", "--global-batch-tokens", "256", "--steps", str(STEPS),
                    "--save-every", "0", "--sample-tokens", "0", "--out", str(out)], nproc=2)
    return out, r.stdout


def test_smoke_run_logs_and_learns(reference):
    out, stdout = reference
    assert "removed ckpt.pt.tmp, a partial file left by an interrupted run" in stdout
    assert not (out / "ckpt.pt.tmp").exists()
    assert "accumulation 2 = 256 tokens per step" in stdout
    assert "no MFU on CPU" in stdout and "MFU " not in stdout.replace("no MFU", "")
    losses = [float(line.split("loss ")[1].split()[0]) for line in stdout.splitlines() if " | loss " in line]
    assert len(losses) == STEPS // 4 and losses[-1] < losses[0] - 0.05, losses
    ck = load(out)
    assert ck["step"] == STEPS and ck["world_size"] == 1
    assert {"model", "optimizer", "sampler_rng", "cpu_rng"} <= set(ck)


def test_run_log_and_record(reference):
    out, stdout = reference
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [x["step"] for x in lines] == [4, 8, 12, 16]
    assert [x["val_loss"] is None for x in lines] == [True, False, True, False]
    assert lines[-1]["val_bpb"] > 0 and lines[-1]["mfu"] is None and lines[-1]["peak_mem_mib"] is None
    assert {"train_loss", "lr", "tokens_per_s", "skipped_steps", "time"} <= set(lines[0])
    assert f"loss {lines[-1]['train_loss']:.4f}" in stdout
    rec = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert rec["args"]["steps"] == STEPS and "train_gpu.py" in rec["command"] and rec["processes"] == 1
    assert rec["cuda"] is None and rec["nccl"] is None and rec["torch"] == torch.__version__
    assert rec["start"] <= rec["end"] and "git_commit" in rec
    assert f"val bits per byte {lines[-1]['val_bpb']:.4f}" in stdout
    sample = next(x for x in stdout.splitlines() if x.startswith("sample (64 tokens"))
    assert len(sample) > 40


def test_two_processes_match_one(reference, two_processes):
    """2 gloo processes × micro-batch 2 see the same rows as 1 process × 4: same parameters."""
    out, stdout = two_processes
    assert "2 process(es)" in stdout and "accumulation 2" in stdout
    ref, two = load(reference[0])["model"], load(out)["model"]
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
    assert "tokens.bin (uint16 memmap; last 5%, 1,000 tokens, held out), 19,000 tokens" in r.stdout
    assert "tokenizer: unknown" in r.stdout and "sample: skipped" in r.stdout
    np.concatenate([ids[:2000], [9000]]).astype(np.uint16).tofile(tmp_path / "bad.bin")
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


def test_data_file_with_a_tokenizer_reports_bits_per_byte(tmp_path):
    from data import cache_dir
    ids = np.random.default_rng(1).integers(0, 8192, size=20_000, dtype=np.uint16)
    ids.tofile(tmp_path / "tokens.bin")
    r = run(TINY + ["--micro-batch", "2", "--steps", "4", "--eval-every", "4", "--eval-batches", "2",
                    "--data", str(tmp_path / "tokens.bin"), "--tokenizer", str(cache_dir() / "tokenizer.model"),
                    "--sample-tokens", "8", "--out", str(tmp_path / "run")])
    assert "tokenizer: tokenizer.model" in r.stdout and "val bits per byte" in r.stdout
    assert "sample (8 tokens" in r.stdout


def test_fp16_with_grad_scaler_skips_an_inf_step(tmp_path):
    """The fp16 path of a GPU without bf16, on the CPU: loss scaling, and a step with an inf gradient
    is skipped (no update, scale halved) and counted."""
    r = run(["--device", "cpu", "--precision", "fp16", "--d-model", "32", "--n-layer", "1", "--n-head", "2",
             "--seq-len", "16", "--micro-batch", "2", "--global-batch-tokens", "32", "--steps", "3",
             "--log-every", "1", "--sample-tokens", "0", "--inject-inf-grad-at", "2", "--out", str(tmp_path)])
    assert "precision: fp16 autocast + GradScaler" in r.stdout
    steps = [x for x in r.stdout.splitlines() if x.startswith("step")]
    assert [x.endswith(f"fp16 steps skipped {n}") for x, n in zip(steps, (0, 1, 1))] == [True] * 3, steps
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [x["skipped_steps"] for x in log] == [0, 1, 1]
    ck = load(tmp_path)
    assert ck["scaler"]["scale"] == 2.0**15 and ck["skipped_steps"] == 1  # 2**16 halved once
    assert ck["optimizer"]["state"][0]["step"].item() == 2  # AdamW stepped on 2 of the 3 steps


def _ckpt_bytes(obj):
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _bad_inputs():
    """(name, arrange(tmp) -> extra args, expected words in the one-line error)."""
    good_cfg = {"vocab_size": 8192, "d_model": 32, "n_layer": 2, "n_head": 2, "seq_len": 32}
    keys = {"model": {}, "optimizer": {}, "step": 1, "sampler_rng": None, "cpu_rng": None}

    def ckpt(data):
        def arrange(t):
            (t / "out").mkdir()
            (t / "out" / "ckpt.pt").write_bytes(data)
            return ["--resume", "--out", str(t / "out")]
        return arrange

    def tokens(n):
        def arrange(t):
            np.zeros(n, dtype=np.uint16).tofile(t / "tok.bin")
            return ["--data", str(t / "tok.bin"), "--out", str(t / "out")]
        return arrange

    def file_at(rel):
        def arrange(t):
            (t / "f").write_text("x")
            return ["--out", str(t / rel)]
        return arrange

    return [
        ("truncated checkpoint", ckpt(_ckpt_bytes({"model": torch.zeros(1000)})[:300]), "cannot be read as a checkpoint"),
        ("not a checkpoint", ckpt(b"hello"), "cannot be read as a checkpoint"),
        ("foreign checkpoint", ckpt(_ckpt_bytes({"state_dict": {}})), "not a train_gpu.py checkpoint"),
        ("checkpoint of another model", ckpt(_ckpt_bytes({**keys, "model_config": {**good_cfg, "d_model": 64}})),
         "differs from this run's"),
        ("heads do not divide d-model", lambda t: ["--n-head", "3", "--out", str(t / "o")], "heads of even size"),
        ("odd head dimension", lambda t: ["--d-model", "34", "--out", str(t / "o")], "heads of even size"),
        ("--out is a file", file_at("f"), "is a file, not a folder"),
        ("--out under a file", file_at("f/run"), "which is a file, not a folder"),
        ("--out not writable", lambda t: ["--out", "/proc/self/run"], "not writable"),
        ("token file shorter than a sequence", tokens(20), "fewer than one sequence"),
        ("token file too short to hold out 5%", tokens(600), "held out for validation is shorter"),
        ("token file of odd size", lambda t: [(t / "x.bin").write_bytes(b"abc"), "--data", str(t / "x.bin")][1:],
         "not a uint16 token file"),
        ("missing token file", lambda t: ["--data", str(t / "none.bin")], "does not exist"),
        ("tokenizer that is not a model", lambda t: [(t / "tok.bin").write_bytes(b"\0" * 4000),
                                                     (t / "m").write_text("no"), "--data", str(t / "tok.bin"),
                                                     "--tokenizer", str(t / "m")][2:], "not a SentencePiece model"),
        ("batch not a multiple", lambda t: ["--global-batch-tokens", "1000"], "not a positive multiple"),
        ("negative eval interval", lambda t: ["--eval-every", "-1"], "--eval-every"),
    ]


@pytest.mark.parametrize("arrange, expect", [c[1:] for c in _bad_inputs()], ids=[c[0] for c in _bad_inputs()])
def test_bad_input_is_one_sentence_before_any_work(tmp_path, capsys, arrange, expect):
    from train_gpu import main
    extra = arrange(tmp_path)
    if "--out" not in extra:
        extra += ["--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as e:
        main(TINY + ["--micro-batch", "2", "--steps", "2"] + extra)
    message = e.value.code
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message, message
    assert expect in message, message
    assert not (tmp_path / "o").exists()  # nothing started


def test_bad_input_on_the_command_line_has_no_traceback(tmp_path):
    (tmp_path / "f").write_text("x")
    r = run(TINY + ["--out", str(tmp_path / "f" / "run")], check=False)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "which is a file, not a folder" in r.stderr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_with_c10d_rendezvous_match_one_node(two_processes, tmp_path):
    """Two torchrun "nodes" on this machine (one gloo process each) meet through c10d rendezvous on
    127.0.0.1: the same arithmetic as one node with 2 processes, so the same parameters, bitwise."""
    port = _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"test{port}",
           "--rdzv-conf", "join_timeout=20", SCRIPT] + TINY + [
           "--micro-batch", "2", "--global-batch-tokens", "256", "--steps", str(STEPS), "--save-every", "0",
           "--sample-tokens", "0", "--out", str(tmp_path)]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO,
                              start_new_session=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=150) for p in nodes]
    finally:
        for p in nodes:  # a node left waiting for its partner: end it and its workers
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [p.returncode for p in nodes] == [0, 0], outs
    assert "2 process(es)" in outs[0][0] + outs[1][0]
    ref, two_nodes = load(two_processes[0])["model"], load(tmp_path)["model"]
    for k in ref:
        assert torch.equal(ref[k], two_nodes[k]), k
