"""train_gpu.py on a CPU with gloo: the logic readers take to a GPU box, run as a smoke test.

The equality matrix: 1, 2 and 4 processes under DDP and FSDP end with the parameters of one process
within TOL; a checkpoint saved at 2 processes under FSDP (by a real SIGTERM) resumes at 1, 2 and 4
processes and under DDP, and one saved under DDP resumes under FSDP, each ending where the
uninterrupted run ends (bitwise at the same world size and scheme).

Faults (a NaN, an inf gradient, a stop request, a hung peer) are injected by monkeypatching
(tests/train_gpu_faults.py), never by the script itself. Tests marked slow start processes; the others
run train_gpu's main in this process (refusals, a tiny checkpoint, the loader's fuzzing)."""
import argparse
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import psutil
import pytest
import torch
from together import run_together

from checkpoint import SAFE_GLOBALS
from data import REPO

SCRIPT = str(REPO / "code" / "train_gpu.py")
FAULTY = str(REPO / "tests" / "train_gpu_faults.py")  # train_gpu.py with TRAIN_GPU_FAULTS injected
STEPS = 8
TINY = ["--device", "cpu", "--d-model", "32", "--n-layer", "2", "--n-head", "2", "--seq-len", "32",
        "--lr", "1e-3", "--warmup", "2", "--grad-clip", "0.5", "--global-batch-tokens", "512",
        "--timeout-s", "60", "--sample-tokens", "0"]
RUN = TINY + ["--steps", str(STEPS), "--log-every", "1", "--save-every", "0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
# AdamW divides by sqrt(v): where a gradient is tiny, float summation order (which process adds
# which rows, a reduce-scatter instead of a local sum) changes an update by up to ~lr. TOL must sit
# above the noise measured by reordering the sums inside one process (test_tolerance_...).
TOL = 1e-5


def launch(args, nproc=1, faults=None):
    """(argv, workers, env, cwd) of train_gpu.py's run: with `python` alone for 1 process, else torchrun."""
    script = SCRIPT if faults is None else FAULTY
    launcher = [sys.executable, script] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script]
    return launcher + args, nproc, {**ENV, "TRAIN_GPU_FAULTS": faults or ""}, REPO


def run(args, nproc=1, timeout=240, check=True, faults=None):
    argv, _, env, cwd = launch(args, nproc, faults)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:  # the launcher and its workers: the whole session
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if check:
        assert r.returncode == 0, out + err
    return r


def weights(out):
    return torch.load(out / "model.pt", weights_only=True)  # the one-file export: plain tensors only


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def train_log(out, key="train_loss"):
    """log.jsonl's lines of training steps (key="val_loss": of evaluations)."""
    return [x for x in map(json.loads, (out / "log.jsonl").read_text(encoding="utf-8").splitlines()) if key in x]


def ckpt_dirs(out):
    return sorted((out / "checkpoints").glob("step_*"))


slow = pytest.mark.slow  # starts processes (tests/conftest.py: the fast path leaves these out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Uninterrupted runs of 8 AdamW steps, evaluated at the end on 3 batches (4 processes: one runs a
    padding batch): {(processes, scheme): (out, stdout)}, and a 1-process run with another micro-batch split
    (only the summation order differs) for the noise floor; started together (tests/together.py), with
    "ddp stopped": (out, the finished process), a DDP run stopped at step 4 for a resume under FSDP, and
    "two nodes": (out, [the two launches]), two torchrun nodes of one process meeting through c10d."""
    outs, launches = {}, {}
    for nproc, shard, micro in ((4, "ddp", 2), (4, "fsdp", 2), (2, "ddp", 4), (2, "fsdp", 2),
                                (1, "ddp", 8), (1, "noise", 4)):
        outs[nproc, shard] = tmp_path_factory.mktemp(f"run{nproc}{shard}")
        launches[nproc, shard] = launch(RUN + ["--micro-batch", str(micro), "--shard", "ddp" if shard == "noise"
                                               else shard, "--eval-every", str(STEPS), "--eval-batches", "3",
                                               "--out", str(outs[nproc, shard])], nproc=nproc)
    # started with them, for test_resume_ddp_checkpoint_under_fsdp: 2 processes under DDP, stopped at step 4
    stopped = tmp_path_factory.mktemp("ddp-stopped") / "ddp"
    launches["ddp stopped"] = launch(RUN + ["--micro-batch", "4", "--out", str(stopped)], nproc=2, faults="stop=4")
    # and for test_two_nodes_with_c10d_rendezvous_match_one_node, first (neither waits for the other's slot)
    two_nodes, port = tmp_path_factory.mktemp("two-nodes"), _free_port()
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"test{port}",
            "--rdzv-conf", "join_timeout=20", SCRIPT] + RUN + ["--micro-batch", "4", "--out", str(two_nodes)]
    launches = {"node 0": (node, 1, ENV, REPO), "node 1": (node, 1, ENV, REPO), **launches}
    ran = run_together(launches)
    return {"ddp stopped": (stopped, ran.pop("ddp stopped")),
            "two nodes": (two_nodes, [ran.pop("node 0"), ran.pop("node 1")]),
            **{key: (outs[key], checked(r).stdout) for key, r in ran.items()}}


def checked(r):
    """A finished run of run_together, asserted to have exited 0 (as run() asserts)."""
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@slow
def test_smoke_run_logs_and_learns(runs):
    out, stdout = runs[1, "ddp"]
    assert "1 process on cpu" in stdout and "accumulation 2 = 512 tokens per step" in stdout
    assert "no MFU on CPU" in stdout and "MFU " not in stdout.replace("no MFU", "")
    log = train_log(out)
    assert [x["step"] for x in log] == list(range(1, STEPS + 1))
    assert log[-1]["train_loss"] < log[0]["train_loss"]
    assert max(x["grad_norm"] for x in log) > 0.5  # the clip at 0.5 acts: clipping is in the comparison
    rec = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert rec["exit_code"] == 0 and rec["processes"] == 1 and rec["start"] <= rec["end"]
    assert [d.name for d in ckpt_dirs(out)] == [f"step_{STEPS:08d}"]  # --save-every 0: the final save only


@slow
def test_ledger_and_held_state_are_logged(runs):
    _, one = runs[1, "ddp"]
    _, fsdp = runs[2, "fsdp"]
    assert "1 process on cpu" in one and "FSDP2 over 2 processes, ZeRO-3: weights freed after forward" in fsdp
    assert "memory ledger (code/shapes.py) for this run on a GPU" in one and "sent per device per step: nothing" in one
    assert "sent per device per step: all-gather " in fsdp
    assert "precision: fp32; whole fp32 gradients held until the last micro-batch |" in fsdp  # accumulation 4

    def held(text):
        line = next(x for x in text.splitlines() if x.startswith("state held by process 0"))
        return {k: float(line.split(k + " ")[1].split()[0]) for k in ("weights", "grads", "optimizer")}
    h1, h2 = held(one), held(fsdp)
    for k in h1:  # FSDP over 2 processes holds half of every part (up to the rounding of uneven shards)
        assert abs(h2[k] - h1[k] / 2) < 0.02 * h1[k], (k, h1, h2)
    assert abs(h1["optimizer"] - 2 * h1["weights"]) < 1e-9  # AdamW's two moments per fp32 weight


@slow
def test_tolerance_is_above_the_summation_order_noise(runs):
    noise = max_diff(weights(runs[1, "ddp"][0]), weights(runs[1, "noise"][0]))
    print(f"summation-order noise after {STEPS} AdamW steps (1 process, micro-batch 8 vs 4): {noise:.2e}")
    assert noise < TOL / 2, noise


@slow
@pytest.mark.parametrize("nproc, shard", [(2, "ddp"), (2, "fsdp"), (4, "ddp"), (4, "fsdp")])
def test_processes_and_schemes_end_with_the_same_parameters(runs, nproc, shard):
    """The global batch is fixed in tokens: N processes see the rows one process sees."""
    out, stdout = runs[nproc, shard]
    assert f"over {nproc} processes" in stdout and "= 512 tokens per step" in stdout
    diff = max_diff(weights(runs[1, "ddp"][0]), weights(out))
    print(f"{nproc} processes, {shard}: max |Δθ| = {diff:.2e} against 1 process")
    assert diff < TOL, diff


@slow
def test_evaluation_split_across_processes_equals_one_process(runs):
    """Each process evaluates its share of the 3 fixed batches (of --micro-batch rows; some process runs
    a padding batch that counts zero) and the sums are all-reduced: the same validation loss and bits per
    byte as one process evaluating all of them, up to the weights' 1e-5."""
    def val(key):
        (entry,) = train_log(runs[key][0], "val_loss")
        assert entry["step"] == STEPS and entry["val_bpb"] > 0
        return entry["val_loss"], entry["val_bpb"]
    for ref, others in (((1, "noise"), [(2, "ddp")]), ((2, "fsdp"), [(4, "ddp"), (4, "fsdp")])):  # same micro-batch
        for key in others:
            assert max(abs(a - b) for a, b in zip(val(ref), val(key))) < 1e-4, (ref, key, val(ref), val(key))


@slow
def test_sigterm_to_the_launcher_saves_and_records_75_within_the_shutdown_timeout(tmp_path):
    """As Slurm or a spot notice does it: SIGTERM to torchrun, which forwards it to both workers and kills
    them after --shutdown-timeout. They save a complete checkpoint, record 75 and exit, without model.pt."""
    import time
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--shutdown-timeout", "60", FAULTY] + RUN + ["--micro-batch", "4", "--out", str(tmp_path)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env={**ENV, "TRAIN_GPU_FAULTS": "sleep=300"}, start_new_session=True)
    try:
        for line in p.stdout:
            if line.startswith("step     2/"):
                p.send_signal(signal.SIGTERM)
                sent = time.perf_counter()
                break
        out, err = p.communicate(timeout=120)
        took = time.perf_counter() - sent
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert took < 60, (took, err)  # within the shutdown timeout: nobody was killed
    assert json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))["exit_code"] == 75, out + err
    (d,) = ckpt_dirs(tmp_path)
    assert (d / ".metadata").is_file() and len(list(d.glob("*.distcp"))) == 2
    assert not (tmp_path / "model.pt").exists() and "stopped by SIGTERM" in out


def test_sharded_init_equals_the_unsharded_one(tmp_path):
    """A model built on the meta device and sharded by the script's own shard() (FSDP2 on a 1-process gloo
    mesh, so every parameter is a DTensor), then initialised, equals the plain model of the same seed."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import train_gpu
    from model import GPT, GPTConfig, full_init, init_per_parameter
    cfg = GPTConfig(vocab_size=64, d_model=16, n_layer=2, n_head=2, seq_len=8)
    plain = GPT(cfg)
    init_per_parameter(plain, 7)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with torch.device("meta"):
            sharded = GPT(cfg)
        args = argparse.Namespace(shard="fsdp", reshard_after_forward=True)
        train_gpu.shard(sharded, args, torch.device("cpu"), "fp32")
        sharded.to_empty(device="cpu")
        init_per_parameter(sharded, 7)
        assert all(isinstance(p, DTensor) for p in sharded.parameters())  # the sharded branch ran
        full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sharded.state_dict().items()}
    finally:
        dist.destroy_process_group()
    assert full.keys() == plain.state_dict().keys()
    assert all(torch.equal(full[k], v) for k, v in plain.state_dict().items())
    default = GPT(cfg)
    for name, p in plain.named_parameters():  # the default init's distributions
        d = dict(default.named_parameters())[name]
        assert abs(p.std().item() - d.std().item()) < 0.35 * d.std().item() + 1e-6, name
        assert torch.equal(full_init(name, p.shape, cfg, 7), p.detach())
    assert plain.lm_head.weight is plain.tok_emb.weight


def poll_steps(step_s, steps, stop_at=None):
    """The steps at which a StopFlag polls when each step takes step_s seconds (a fake clock), and the
    step its stop is agreed at if a signal arrives during step stop_at."""
    import types

    import train_gpu
    now = [0.0]
    saved = {s: signal.getsignal(s) for s in train_gpu.STOP_SIGNALS}
    try:
        flag = train_gpu.StopFlag(clock=lambda: now[0])
        t = types.SimpleNamespace(device=torch.device("cpu"))
        polls, stopped = [], None
        for done in range(1, steps + 1):
            now[0] += step_s
            if done == stop_at:
                flag.signum = signal.SIGTERM
            before = flag.polled
            if flag.agreed(t, done, poll=False) and stopped is None:
                stopped = done
            if flag.polled is not before:
                polls.append(done)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    return polls, stopped


@slow
def test_a_stop_signal_before_training_stops_at_the_first_step_with_a_checkpoint(tmp_path):
    """A preemption notice that arrives while the data loads (before training starts) is not lost: the
    process saves at the first step and exits 75, which the launch files requeue. Before the stop flag was
    made at the top of main, SIGTERM killed the process there and run.json recorded nothing."""
    r = run(RUN + ["--micro-batch", "16", "--out", str(tmp_path)], faults="early_signal=1", check=False)
    assert r.returncode == 75, r.stdout + r.stderr
    assert json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))["exit_code"] == 75
    (d,) = ckpt_dirs(tmp_path)
    assert (d / ".metadata").is_file() and "stopped by SIGTERM" in r.stdout


def test_the_stop_flag_is_polled_on_wall_time():
    """About every STOP_POLL_S seconds, whether a step takes 1 s or 10 ms: a stop is agreed within it."""
    import train_gpu
    assert train_gpu.STOP_POLL_S == 10
    polls, stopped = poll_steps(1.0, 40, stop_at=14)
    assert polls == [1, 2, 3, 13, 23, 33] and stopped == 23  # the first steps measure the pace
    polls, _ = poll_steps(0.01, 3000)
    assert polls == [1, 2, 3, 1003, 2003]
    polls, stopped = poll_steps(30.0, 5, stop_at=4)
    assert polls == [1, 2, 3, 4, 5] and stopped == 4  # a step longer than STOP_POLL_S: every step


def test_windows_without_sigusr1_imports_the_code():
    """Windows has neither SIGUSR1 nor fork: every module of code/ still imports, and the stop signals are
    the ones the platform has."""
    probe = ("import importlib, os, pathlib, signal, sys; del signal.SIGUSR1, os.fork; sys.path.insert(0, 'code'); "
             "[importlib.import_module(p.stem) for p in sorted(pathlib.Path('code').glob('*.py'))]; "
             "import train_gpu; print(train_gpu.STOP_SIGNALS)")
    p = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "(<Signals.SIGTERM: 15>,)", p.stdout + p.stderr


@pytest.fixture(scope="module")
def sigterm(tmp_path_factory):
    """2 processes under FSDP; SIGTERM to rank 1 (not the one that logs) after step 2."""
    out = tmp_path_factory.mktemp("sigterm")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", FAULTY] + RUN + [
        "--micro-batch", "2", "--shard", "fsdp", "--out", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env={**ENV, "TRAIN_GPU_FAULTS": "sleep=300"}, start_new_session=True)
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("step     2/"):
                workers = [c for c in psutil.Process(p.pid).children(recursive=True)
                           if c.environ().get("RANK") == "1"]
                workers[0].send_signal(signal.SIGTERM)
                break
        rest, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return out, "".join(lines) + rest, err, p.returncode


@slow
def test_sigterm_to_one_rank_stops_both_at_one_step_with_a_complete_checkpoint(sigterm):
    out, stdout, stderr, code = sigterm
    print(stdout + "\n".join(x for x in stderr.splitlines() if "exitcode" in x))
    stop = next(x for x in stdout.splitlines() if x.startswith("stopped by SIGTERM after step"))
    step = int(stop.split("after step ")[1].split(":")[0])
    assert 2 <= step < STEPS and "exit status 75" in stop
    assert code != 0 and stderr.count("exitcode  : 75") == 2  # both ranks, torchrun's report
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["exit_code"] == 75
    (d,) = ckpt_dirs(out)
    assert d.name == f"step_{step:08d}" and (d / ".metadata").is_file()
    assert {f.name for f in d.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}  # both ranks saved
    assert json.loads((d / "train_state.json").read_text(encoding="utf-8"))["step"] == step


@pytest.fixture(scope="module")
def resumed(runs, sigterm, tmp_path_factory):
    """The SIGTERM's checkpoint (2 processes, FSDP) resumed as it was saved and elsewhere, each from its own
    copy, the runs started together: {(processes, scheme, micro-batch): (out, stdout)}; with them, "cut":
    (out, the finished process), the 1-process run resumed over a save that was cut."""
    launches, outs = {}, {}
    for nproc, shard, micro in ((4, "fsdp", 2), (2, "fsdp", 2), (2, "ddp", 4), (1, "ddp", 8)):
        out = outs[nproc, shard, micro] = tmp_path_factory.mktemp(f"resumed{nproc}{shard}") / "resumed"
        shutil.copytree(sigterm[0], out)
        launches[nproc, shard, micro] = launch(RUN + ["--micro-batch", str(micro), "--shard", shard, "--resume",
                                                      "--out", str(out)], nproc=nproc)
    cut = outs["cut"] = tmp_path_factory.mktemp("cut") / "cut"
    shutil.copytree(runs[1, "ddp"][0], cut)
    (cut / "checkpoints" / "step_00000009").mkdir()
    (cut / "checkpoints" / "step_00000009" / "__0_0.distcp").write_bytes(b"half")  # killed before .metadata
    (cut / "model.pt.tmp").write_bytes(b"half")
    launches["cut"] = launch(RUN + ["--steps", "10", "--micro-batch", "8", "--resume", "--out", str(cut)])
    ran = run_together(launches)
    return {"cut": (cut, ran.pop("cut")), **{key: (outs[key], checked(r).stdout) for key, r in ran.items()}}


def resume_from(resumed, nproc, shard, micro):
    out, stdout = resumed[nproc, shard, micro]
    assert "resumed from step_" in stdout and "saved by 2 process(es), fsdp" in stdout
    return out


@slow
def test_resume_at_the_same_world_size_is_bitwise(runs, resumed):
    out = resume_from(resumed, 2, "fsdp", 2)
    ref = weights(runs[2, "fsdp"][0])
    resumed = weights(out)
    assert all(torch.equal(ref[k], resumed[k]) for k in ref)
    log, ref_log = train_log(out), train_log(runs[2, "fsdp"][0])
    assert [x["train_loss"] for x in log] == [x["train_loss"] for x in ref_log]  # compared from the logs


@slow
@pytest.mark.parametrize("nproc, shard, micro", [(1, "ddp", 8), (4, "fsdp", 2), (2, "ddp", 4)])
def test_resume_fsdp_checkpoint_elsewhere(runs, resumed, nproc, shard, micro):
    out = resume_from(resumed, nproc, shard, micro)
    diff = max_diff(weights(runs[2, "fsdp"][0]), weights(out))
    print(f"saved 2 fsdp, resumed {nproc} {shard}: max |Δθ| = {diff:.2e}")
    assert diff < TOL, diff


@slow
def test_resume_ddp_checkpoint_under_fsdp(runs, tmp_path):
    stopped, r = runs["ddp stopped"]
    assert r.returncode != 0 and "stopped by SIGTERM after step 4" in r.stdout
    out = tmp_path / "ddp"
    shutil.copytree(stopped, out)
    r = run(RUN + ["--micro-batch", "2", "--shard", "fsdp", "--resume", "--out", str(out)], nproc=2)
    assert "saved by 2 process(es), ddp" in r.stdout
    diff = max_diff(weights(runs[2, "ddp"][0]), weights(out))
    print(f"saved 2 ddp, resumed 2 fsdp: max |Δθ| = {diff:.2e}")
    assert diff < TOL, diff


@slow
def test_a_cut_save_leaves_the_previous_checkpoint(resumed):
    # the 1-process run's folder with a save that was cut (resumed["cut"]: its checkpoint step_00000009
    # holds a shard and no .metadata, and model.pt.tmp is half written), resumed to step 10
    out, r = resumed["cut"]
    checked(r)
    assert "removed checkpoints/step_00000009, a checkpoint whose save was cut" in r.stdout
    assert "resumed from step_00000008 at step 8" in r.stdout and not (out / "model.pt.tmp").exists()


def refusal(e, capsys, status=1) -> str:
    """The one line a refusal printed (stderr), after checking its exit status."""
    err = capsys.readouterr().err
    assert e.value.code == status and err.count("\n") == 1 and err.startswith("error: "), (e.value.code, err)
    return err.strip()


def main_here(args, status=0):
    """train_gpu.main(args) in this process, which it leaves as it was (signal handlers); returns stdout."""
    from train_gpu import main
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with pytest.raises(SystemExit) as e:
            main(args)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert status is None or e.value.code == status
    return e


HERE = TINY + ["--micro-batch", "8", "--steps", "2", "--log-every", "1"]  # 1 process, in this process


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-step run's --out folder, trained in this process (a few seconds): its checkpoint is the
    material of the in-process refusals and the fuzzing."""
    out = tmp_path_factory.mktemp("tiny") / "out"
    main_here(HERE + ["--out", str(out)])
    return out


def _copy_checkpoint(tiny, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tiny, out)
    return out, ckpt_dirs(out)[-1]


def _pickle_calling(module, name, arg) -> bytes:
    """Protocol 4: STACK_GLOBAL(module, name)(arg). A dotted name reaches an attribute of an attribute."""
    def text(x):
        b = x.encode()
        return b"\x8c" + bytes([len(b)]) + b
    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(arg) + b"\x85R."


@pytest.mark.parametrize("module, name", [
    ("posix", "system"),
    ("torch.distributed.checkpoint.filesystem", "os.system"),  # filesystem.py does `import os`
    ("torch.distributed.checkpoint.metadata", "dataclasses.sys.modules.os.system"),
    ("torch", "os.system"),
])
def test_a_checkpoint_that_would_run_code_is_refused(tiny, tmp_path, capsys, module, name):
    out, d = _copy_checkpoint(tiny, tmp_path)
    (d / ".metadata").write_bytes(_pickle_calling(module, name, f"touch {tmp_path / 'pwned'}"))
    e = main_here(HERE + ["--resume", "--out", str(out)], status=1)
    msg = refusal(e, capsys)
    assert "cannot be read safely" in msg and f"{module}.{name} is not allowed" in msg, msg
    assert not (tmp_path / "pwned").exists()


def _text(x: str) -> bytes:
    b = x.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _global(module: str, name: str) -> bytes:
    return _text(module) + _text(name) + b"\x93"  # STACK_GLOBAL


def _poison(target: bytes, attr: str, value: bytes, slot=True) -> bytes:
    """GLOBAL target; BUILD (None, {attr: value}) (or ({attr: value},) into its __dict__); POP: what sets
    an attribute of an allowlisted class or function when pickle's BUILD is not restricted."""
    state = b"}" + _text(attr) + value + b"s"  # EMPTY_DICT key value SETITEM
    return target + ((b"N" + state + b"\x86") if slot else state) + b"b0"  # TUPLE2 BUILD POP


def _allowed_objects():
    """Every object a .metadata may name (the allowlist, the enum's members) or that torch's layout
    lookup caches: what a load must leave as it was."""
    import enum
    import importlib

    from checkpoint import SAFE_GLOBALS
    objs = [getattr(importlib.import_module(m), n) for m, n in sorted(SAFE_GLOBALS)]
    return objs + [m for o in objs if isinstance(o, type) and issubclass(o, enum.Enum) for m in o]


def _snapshot():
    """{id: (object, its __dict__ copied, _get_layout's cache copied)} of _allowed_objects()."""
    return {id(o): (o, dict(vars(o)), dict(getattr(o, "cache", None) or {})) for o in _allowed_objects()
            if hasattr(o, "__dict__")}


def _changed(before) -> list:
    """The objects of `before` whose attributes are not the same objects as then; restores them."""
    changed = []
    for o, attrs, cache in before.values():
        now = dict(vars(o))
        if now.keys() != attrs.keys() or any(now[k] is not attrs[k] for k in attrs) or (
                cache and o.cache != cache):
            changed.append(getattr(o, "__qualname__", repr(o)))
            for k in now.keys() - attrs.keys():
                delattr(o, k)
            for k, v in attrs.items():
                if now.get(k) is not v:
                    setattr(o, k, v)
            if cache:
                o.cache.clear()
                o.cache.update(cache)
    return changed


BUILD_PAYLOADS = {  # the review's (code-review.md §7): each changes how the loading process handles paths
    "PosixPath.__ne__ = PosixPath (the next save deletes the checkpoint it wrote)":
        _poison(_global("pathlib", "PosixPath"), "__ne__", _global("pathlib", "PosixPath")),
    "PosixPath.is_dir = torch.Size (no checkpoint is found)":
        _poison(_global("pathlib", "PosixPath"), "is_dir", _global("torch", "Size")),
    "PosixPath.__fspath__ = _get_layout and its cache (paths redirected)":
        _poison(_global("torch.serialization", "_get_layout"), "cache",
                b"}" + _global("pathlib", "PosixPath") + _text("/ckpt/train-gpu") + b"\x85R" + _text("/elsewhere")
                + b"s", slot=False)
        + _poison(_global("pathlib", "PosixPath"), "__fspath__", _global("torch.serialization", "_get_layout")),
}


@pytest.mark.parametrize("payload", list(BUILD_PAYLOADS))
def test_a_checkpoint_that_would_change_the_loader_is_refused(tiny, tmp_path, capsys, payload):
    """PROTO + the poison + the real .metadata's bytes, which pickle reads as one stream: the
    checkpoint would load whole, and with it the process's PosixPath or _get_layout changed."""
    out, d = _copy_checkpoint(tiny, tmp_path)
    good = (d / ".metadata").read_bytes()
    (d / ".metadata").write_bytes(b"\x80\x04" + BUILD_PAYLOADS[payload] + good)
    capsys.readouterr()
    before = _snapshot()
    try:
        e = main_here(HERE + ["--steps", "3", "--resume", "--out", str(out)], status=None)
    finally:
        changed = _changed(before)
    assert changed == [], changed
    msg = refusal(e, capsys)
    assert "cannot be read safely" in msg and "BUILD on a " in msg and "is not allowed" in msg, msg


def _damage(case, d, tmp_path):
    """Change the checkpoint folder d as `case` says; return (extra arguments, words of the refusal)."""
    shard = d / "__0_0.distcp"
    if case == "other shape in the run":
        return ["--d-model", "64"], "differs from this run's"
    if case == "missing shard":
        shard.unlink()
        return [], "__0_0.distcp is missing"
    if case == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
        return [], "__0_0.distcp is truncated"
    if case == "bad state":
        (d / "train_state.json").write_text("{")
        return [], "not a train_gpu.py training state"
    if case == "state without a world size":
        state = json.loads((d / "train_state.json").read_text())
        del state["world_size"]
        (d / "train_state.json").write_text(json.dumps(state))
        return [], "not a train_gpu.py training state"
    if case == "damaged shard":  # the right size, its first bytes zeroed
        data = bytearray(shard.read_bytes())
        data[:64] = bytes(64)
        shard.write_bytes(bytes(data))
        return [], "a shard is damaged"
    if case == "pickle in a shard":  # an item rewritten as a pickle of the same length: weights_only refuses it
        md = pickle.loads((d / ".metadata").read_bytes())
        info = next(v for k, v in md.storage_data.items() if k.fqn.startswith("optim.param_groups"))
        payload = pickle.dumps(os.system)
        data = bytearray(shard.read_bytes())
        data[info.offset:info.offset + info.length] = payload.ljust(info.length, b".")[:info.length]
        shard.write_bytes(bytes(data))
        return [], "a shard is damaged"
    if case in ("shards of another shape", "another program's folder"):
        other = tmp_path / "other"
        if case == "shards of another shape":  # train_state.json still names this model
            main_here(HERE + ["--d-model", "64", "--out", str(other)])
            saved = ckpt_dirs(other)[-1]
            expect = "holds model.tok_emb.weight as (8192, 64), this run needs (8192, 32)"
        else:
            import torch.distributed.checkpoint as dcp
            saved = other / "ckpt"
            dcp.save({"net": {"w": torch.zeros(3)}}, checkpoint_id=saved, no_dist=True)
            expect = "it was not saved by train_gpu.py for this model"
        for f in d.glob("*.distcp"):
            f.unlink()
        for f in saved.iterdir():
            if f.name != "train_state.json":
                shutil.copy(f, d / f.name)
        return [], expect
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["other shape in the run", "missing shard", "truncated shard", "bad state",
                                  "state without a world size", "damaged shard", "pickle in a shard",
                                  "shards of another shape", "another program's folder"])
def test_bad_checkpoints_are_one_sentence(tiny, tmp_path, capsys, case):
    out, d = _copy_checkpoint(tiny, tmp_path)
    extra, expect = _damage(case, d, tmp_path)
    capsys.readouterr()
    e = main_here(HERE + ["--resume", "--out", str(out)] + extra, status=1)
    msg = refusal(e, capsys)
    assert expect in msg, msg


def test_a_changed_setting_on_resume_is_printed_and_steps_backwards_refused(tiny, tmp_path, capsys):
    out, _ = _copy_checkpoint(tiny, tmp_path)
    e = main_here(HERE + ["--steps", "1", "--resume", "--out", str(out)], status=1)
    assert "is at step 2, beyond --steps 1" in refusal(e, capsys)
    main_here(HERE + ["--steps", "3", "--lr", "2e-3", "--seed", "5", "--resume", "--out", str(out)])
    printed = capsys.readouterr().out
    for line in ("resume: --lr is 0.002, the checkpoint was trained with 0.001",
                 "resume: --steps is 3, the checkpoint was trained with 2",
                 "resume: --seed is 5, the checkpoint was trained with 0"):
        assert line in printed, printed


def test_fp16_with_a_real_overflow_stopped_and_resumed_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    """fp16 with loss scaling, the scale starting at 2^20: the first steps overflow for real and are
    skipped. A run stopped at step 3 (a stop request) and resumed ends bitwise where the uninterrupted
    run ends, with the same skipped steps: the GradScaler's state is restored, not updated."""
    import functools

    import train_gpu_faults
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0**20))
    args = ["--device", "cpu", "--precision", "fp16", "--d-model", "16", "--n-layer", "1", "--n-head", "2",
            "--seq-len", "8", "--vocab-size", "512", "--micro-batch", "1", "--global-batch-tokens", "16",
            "--steps", "6", "--log-every", "1", "--sample-tokens", "0", "--save-every", "0",
            "--data", str(_tokens(tmp_path, 512))]
    main_here(args + ["--out", str(tmp_path / "whole")])
    with monkeypatch.context() as m:
        train_gpu_faults.install("stop=3", m.setattr)
        main_here(args + ["--out", str(tmp_path / "cut")], status=75)
    assert json.loads((tmp_path / "cut" / "run.json").read_text())["exit_code"] == 75
    assert not (tmp_path / "cut" / "model.pt").exists()  # a stop saves the checkpoint only
    main_here(args + ["--resume", "--out", str(tmp_path / "cut")])
    whole, cut = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    assert all(torch.equal(whole[k], cut[k]) for k in whole)

    def log(name):
        return [{k: x[k] for k in ("step", "train_loss", "lr", "skipped_steps")}
                for x in map(json.loads, (tmp_path / name / "log.jsonl").read_text().splitlines())]
    assert log("whole") == log("cut")
    assert 0 < log("whole")[-1]["skipped_steps"] < 6, log("whole")  # some overflowed, later ones stepped


# a checkpoint of about 1.6 MB (the 8192 × 16 embedding with AdamW's two moments): one fits in 2,600 KiB, two do not
SMALL = ["--device", "cpu", "--d-model", "16", "--n-layer", "1", "--n-head", "2", "--seq-len", "32", "--micro-batch",
         "8", "--global-batch-tokens", "512", "--log-every", "1", "--sample-tokens", "0", "--timeout-s", "60"]


@pytest.fixture
def full_disk(tmp_path):
    """A real file system of 2,600 KiB (tmpfs; mounting needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2600k", "tmpfs", str(disk)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.parametrize("when", ["scheduled", "stop"])
def test_a_save_on_a_full_disk_is_one_sentence_recorded_and_keeps_the_one_before(full_disk, tmp_path, capsys,
                                                                                  monkeypatch, when):
    """The second checkpoint does not fit: DCP raises CheckpointException (a BaseException). The run ends
    with one sentence and exit 74, recorded in run.json, the half-written folder removed and the first
    checkpoint whole (it resumes); the same when the save is the one a stop request makes (at step 2):
    74 is recorded, not 75, so that a requeue does not meet the same full disk."""
    import train_gpu_faults
    out = full_disk / "out"
    if when == "stop":
        train_gpu_faults.install("stop=2", monkeypatch.setattr)
    e = main_here(SMALL + ["--steps", "3", "--save-every", "1", "--out", str(out)], status=None)
    msg = refusal(e, capsys, status=74)
    assert "the checkpoint of step 2 could not be saved" in msg and "step_00000001 are kept" in msg, msg
    free = float(msg.split(" MiB were free there on process 0")[0].rsplit("; ", 1)[1])
    one = sum(f.stat().st_size for f in ckpt_dirs(out)[0].iterdir()) / 2**20
    assert free < one and msg.endswith("(exit status 74)"), (free, one, msg)  # the disk could not hold a second
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["exit_code"] == 74
    assert [d.name for d in ckpt_dirs(out)] == ["step_00000001"]  # the cut one is gone: it does not count
    roomy = tmp_path / "roomy"
    shutil.copytree(out, roomy)
    monkeypatch.undo()
    main_here(SMALL + ["--steps", "2", "--save-every", "0", "--resume", "--out", str(roomy)])
    assert "resumed from step_00000001 at step 1" in capsys.readouterr().out


@slow
def test_a_full_disk_under_two_processes_ends_both_with_74(full_disk):
    """The same full disk under torchrun: DCP raises on both processes, whichever one's write failed; both
    exit 74, rank 0 records it and says why, and the first checkpoint (both processes' shards) is kept."""
    out = full_disk / "out"
    r = run(SMALL + ["--steps", "3", "--save-every", "1", "--out", str(out)], nproc=2, check=False)
    errors = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and "the checkpoint of step 2 could not be saved" in errors[0], r.stdout + r.stderr
    assert r.stderr.count("exitcode  : 74") == 2, r.stderr  # torchrun's report of both workers
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["exit_code"] == 74
    (d,) = ckpt_dirs(out)
    assert d.name == "step_00000001" and (d / ".metadata").is_file()


def test_two_complete_checkpoints_are_kept_and_a_damaged_newest_falls_back_or_names_the_one_before(tmp_path, capsys):
    """A newest checkpoint damaged after its save: a truncated shard (found before the load) is named and
    the run resumes from the one before; a shard of the right size with bad bytes (found by the load
    itself, all processes together) is refused, naming the one before, which resumes once it is moved."""
    out = tmp_path / "out"
    main_here(SMALL + ["--steps", "3", "--save-every", "1", "--out", str(out)])
    assert [d.name for d in ckpt_dirs(out)] == ["step_00000002", "step_00000003"]
    newest = ckpt_dirs(out)[-1]
    shard = newest / "__0_0.distcp"
    good = shard.read_bytes()
    shard.write_bytes(good[:len(good) // 2])
    capsys.readouterr()
    cut = tmp_path / "cut"
    shutil.copytree(out, cut)
    main_here(SMALL + ["--steps", "4", "--save-every", "0", "--resume", "--out", str(cut)])
    printed = capsys.readouterr().out
    assert "warning: --resume: shard file step_00000003/__0_0.distcp is truncated; the checkpoint cannot be " \
        "loaded; resuming from the checkpoint before it, step_00000002" in printed, printed
    assert "resumed from step_00000002 at step 2" in printed
    assert "removed checkpoints/step_00000003, a damaged checkpoint after the one this run resumes" in printed
    assert [d.name for d in ckpt_dirs(cut)] == ["step_00000002", "step_00000004"]  # not the damaged one
    shard.write_bytes(bytes(64) + good[64:])
    e = main_here(SMALL + ["--steps", "4", "--resume", "--out", str(out)], status=1)
    msg = refusal(e, capsys)
    assert "a shard is damaged" in msg and "the checkpoint before it, step_00000002, is kept" in msg, msg
    shutil.move(newest, tmp_path / "damaged")
    main_here(SMALL + ["--steps", "4", "--save-every", "0", "--resume", "--out", str(out)])
    assert "resumed from step_00000002 at step 2" in capsys.readouterr().out


def test_out_of_memory_is_one_sentence_with_the_ledger_and_recorded(tmp_path, capsys, monkeypatch):
    """torch.OutOfMemoryError in the second step: the figure the run printed from the ledger, and what to
    lower in the book's order."""
    import train_gpu_faults
    train_gpu_faults.install("oom=2", monkeypatch.setattr)
    e = main_here(HERE + ["--out", str(tmp_path / "out")], status=1)
    out, err = capsys.readouterr()
    msg = err.strip()
    assert err.count("\n") == 1 and msg.startswith("error: process 0 ran out of memory on cpu (CUDA out of"), err
    ledger = out.split("memory ledger (code/shapes.py) for this run on a GPU (flash attention, eager autograd): ")[1]
    assert f"the memory ledger planned {ledger.split(' MiB')[0]} MiB per GPU" in msg, (msg, ledger)
    order = [msg.index(w) for w in ("--micro-batch", "--seq-len", "--checkpoint-activations", "--shard fsdp")]
    assert order == sorted(order), msg
    assert json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))["exit_code"] == 1
    assert e.value.code == 1


def test_processes_that_chose_different_steps_refuse_in_one_sentence(capsys, monkeypatch):
    """agree_on_resume's one all-reduce, with the other process's choice (step 4) added by a stand-in."""
    import torch.distributed as dist

    import train_gpu

    def all_reduce(x, op):
        assert op == dist.ReduceOp.MAX
        x.copy_(torch.maximum(x, torch.tensor([4, -4])))
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    args = train_gpu.build_parser().parse_args(HERE + ["--out", "o"])
    cpu = torch.device("cpu")
    train_gpu.agree_on_resume(args, (None, {"step": 4}), cpu, 2)  # the same step: nothing to say
    for mine, words in (((None, {"step": 8}), "some chose step_00000004, others step_00000008"),
                        ((None, {"step": 2}), "some chose step_00000002, others step_00000004"),
                        (None, "some chose no checkpoint, others step_00000004")):  # this one would start afresh
        with pytest.raises(SystemExit) as e:
            train_gpu.agree_on_resume(args, mine, cpu, 2)
        assert words in refusal(e, capsys)


@slow
def test_processes_that_see_different_checkpoints_refuse_to_resume(alone):
    """The last of 2 processes does not see the newest checkpoint (a bucket mount still syncing): after
    joining they compare the steps they chose, and both refuse in one sentence naming both."""
    # alone["stale"]: main_here(SMALL + ["--steps", "2", "--save-every", "1"]), then the stale=1 fault's 2-process
    # resume of it
    _, r = alone["stale"]
    errors = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    assert r.returncode != 0 and errors, r.stdout + r.stderr
    assert "do not see the same checkpoints" in errors[0] and "some chose step_00000001, others step_00000002" in \
        errors[0], errors
    assert "resumed from" not in r.stdout


def test_a_peer_that_never_joins_is_one_sentence_and_exit_4(tmp_path, capsys, monkeypatch):
    """Rank 0 of 2, started as srun would (the environment, no torchrun), whose peer never comes."""
    port = _free_port()
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    args = TINY + ["--micro-batch", "4", "--global-batch-tokens", "256", "--timeout-s", "1"]
    e = main_here(args + ["--steps", "2", "--out", str(tmp_path / "o")], status=4)
    msg = refusal(e, capsys, status=4)
    assert "did not all join within --timeout-s 1" in msg and "DistStoreError" in msg, msg


PREFLIGHT_LINES = ("preflight: 1 process(es) on cpu", "  matmul 1024³ fp32 per process:", "  all-reduce:",
                   "  host memory copy", "  disk in --out:", "preflight: ")


def test_preflight_measures_the_box_and_trains_nothing(tmp_path, capsys):
    import time
    start = time.perf_counter()
    main_here(HERE + ["--out", str(tmp_path / "o"), "--preflight"])
    took = time.perf_counter() - start
    printed = capsys.readouterr().out
    print(printed)
    for words in PREFLIGHT_LINES:
        assert any(line.startswith(words) for line in printed.splitlines()), (words, printed)
    assert printed.splitlines()[-1].startswith("preflight: 0 warning(s)") and took < 60
    assert list((tmp_path / "o").iterdir()) == []  # no checkpoint, no record, no probe file left


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """Runs that each one test checks, independent of one another, started together (tests/together.py):
    {name: (its --out folder or the folder of its files, the finished process)}."""
    d = {name: tmp_path_factory.mktemp(name.replace(" ", "-"))
         for name in ("preflight", "hung", "fp16 inf", "memmap", "nan", "stale")}
    # for test_processes_that_see_different_checkpoints_refuse_to_resume: two checkpoints, made here
    main_here(SMALL + ["--steps", "2", "--save-every", "1", "--out", str(d["stale"] / "out")])
    launches = {
        "stale": launch(SMALL + ["--steps", "3", "--resume", "--out", str(d["stale"] / "out")], nproc=2,
                        faults="stale=1"),
        "preflight": launch(RUN + ["--micro-batch", "4", "--preflight", "--out", str(d["preflight"])], nproc=2),
        # the last --timeout-s given wins: 5 s instead of RUN's 60
        "hung": launch(RUN + ["--micro-batch", "4", "--timeout-s", "5", "--out", str(d["hung"])], nproc=2,
                       faults="hang=1"),
        "fp16 inf": launch(
            ["--device", "cpu", "--precision", "fp16", "--d-model", "16", "--n-layer", "1", "--n-head", "2",
             "--seq-len", "8", "--vocab-size", "512", "--micro-batch", "1", "--global-batch-tokens", "16",
             "--steps", "3", "--log-every", "1", "--sample-tokens", "0", "--shard", "fsdp", "--save-every", "0",
             "--timeout-s", "60", "--data", str(_tokens(d["fp16 inf"], 512)),
             "--out", str(d["fp16 inf"] / "run")], nproc=2, faults="inf=2"),
        "memmap": launch(TINY + ["--micro-batch", "8", "--steps", "2", "--log-every", "1", "--data",
                                 str(_tokens(d["memmap"], 8192)), "--out", str(d["memmap"] / "run"),
                                 "--sample-tokens", "4"]),
        "nan": launch(TINY + ["--micro-batch", "8", "--steps", "12", "--log-every", "4", "--save-every", "4",
                              "--out", str(d["nan"])], faults="nan=6"),
    }
    ran = run_together(launches, timeout=240)
    return {name: (d[name], r) for name, r in ran.items()}


@slow
def test_preflight_on_two_processes_measures_the_all_reduce(alone):
    tmp_path, r = alone["preflight"]
    checked(r)
    assert "preflight: 2 process(es) on cpu" in r.stdout and "all-reduce 8 MiB: bus bandwidth" in r.stdout, r.stdout
    matmul = next(x for x in r.stdout.splitlines() if "matmul" in x)
    assert len(matmul.split("per process: ")[1].split(" GFLOP/s")[0].split(", ")) == 2  # each process's own
    assert not list(tmp_path.iterdir())


def _fuzzed(rng, good: bytes, sentinel_module: str) -> bytes:
    """Random bytes, a mutated or cut copy of a real .metadata, or one whose globals name a sentinel."""
    kind = rng.integers(7)
    if kind == 0:
        return rng.bytes(int(rng.integers(0, 4096)))
    if kind == 1:
        return good[:int(rng.integers(0, len(good)))]
    data = bytearray(good)
    if kind in (2, 3):
        for _ in range(int(rng.integers(1, 8 if kind == 2 else 64))):
            data[int(rng.integers(len(data)))] = int(rng.integers(256))
        return bytes(data)
    if kind == 4:  # a real call of a sentinel that an allowed module is made to hold
        return _pickle_calling(sentinel_module, "sentinel", "x")
    if kind == 5:  # BUILD on an allowed class, function or enum member, before the real bytes
        module, name = sorted(SAFE_GLOBALS)[int(rng.integers(len(SAFE_GLOBALS)))]
        target = _global(module, name) + (b"K\x00\x85R" if name == "_MEM_FORMAT_ENCODING" else b"")  # a member
        attr = str(rng.choice(["__ne__", "__eq__", "is_dir", "exists", "__fspath__", "cache", "__call__", "x"]))
        value = _global(*sorted(SAFE_GLOBALS)[int(rng.integers(len(SAFE_GLOBALS)))])
        return b"\x80\x04" + _poison(target, attr, value, slot=bool(rng.integers(2))) + good
    name = rng.choice(["os.system", "sentinel.__call__", "sys.modules.os.system", "dataclasses.sys.exit"])
    return _pickle_calling(rng.choice([sentinel_module, "torch", "collections", "pathlib"]), str(name), "x")


def test_fuzzed_metadata_and_train_state_are_refused_in_one_sentence(tiny, tmp_path, capsys, monkeypatch):
    """Thousands of random and mutated .metadata and train_state.json files against the loader's
    checks: each is accepted as a whole or refused with one sentence and exit 1, nothing a pickle
    names is ever called (a sentinel put into an allowed module and the dotted names record it), and no
    attribute of an allowlisted class, function or enum member is changed (checked after every load)."""
    import torch.distributed.checkpoint.filesystem as filesystem

    from checkpoint import read_metadata, read_train_state
    from train_gpu import build_parser, model_config
    calls = []
    monkeypatch.setattr(filesystem, "sentinel", lambda *a: calls.append(a), raising=False)
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    out, d = _copy_checkpoint(tiny, tmp_path)
    config = model_config(build_parser().parse_args(HERE))
    good_meta, good_state = (d / ".metadata").read_bytes(), (d / "train_state.json").read_bytes()
    rng = np.random.default_rng(0)
    refused = accepted = 0
    read_metadata(d)  # torch's layout lookup fills its cache on its first call: that is not a change
    before = _snapshot()
    for i in range(3000):
        if i % 3:
            (d / ".metadata").write_bytes(_fuzzed(rng, good_meta, filesystem.__name__))
            check = lambda: read_metadata(d)  # noqa: E731
        else:
            (d / ".metadata").write_bytes(good_meta)
            state = bytearray(good_state)
            for _ in range(int(rng.integers(1, 6))):
                state[int(rng.integers(len(state)))] = int(rng.choice(list(b'{}[]",:0123456789-.etnul ')))
            (d / "train_state.json").write_bytes(bytes(state))
            check = lambda: read_train_state(d, config)  # noqa: E731
        try:
            check()
            accepted += 1
        except SystemExit as e:
            err = capsys.readouterr().err
            assert e.code == 1 and err.count("\n") == 1 and err.startswith("error: --resume: "), err
            refused += 1
        changed = _changed(before)
        assert changed == [], (i, changed)
    assert calls == [] and refused > 2500, (calls, refused, accepted)
    print(f"fuzzing: {refused} refused in one sentence, {accepted} read as a whole, 0 calls")


@slow
def test_a_hung_process_is_one_sentence_after_the_timeout(alone):
    _, r = alone["hung"]
    line = next(x for x in r.stderr.splitlines() if x.startswith("error: process 0"))
    assert r.returncode != 0 and "a collective failed" in line and "another process died or waited longer than " \
        "--timeout-s 5 (after the first step --step-timeout-s 5)" in line, r.stderr


@slow
def test_nan_stops_with_last_good_checkpoint(alone):
    tmp_path, r = alone["nan"]
    assert r.returncode == 3
    assert "NaN/inf at or before step 8" in r.stdout and "Traceback" not in r.stderr
    assert [d.name for d in ckpt_dirs(tmp_path)] == ["step_00000004"]


@slow
def test_fp16_with_grad_scaler_skips_an_inf_step_under_fsdp(alone):
    """fp16 (a GPU without bf16) on 2 CPU processes under FSDP: an inf in rank 0's shard of the
    gradients skips the step on both ranks (the overflow flag is all-reduced)."""
    _, r = alone["fp16 inf"]
    checked(r)
    assert "precision: FSDP2 MixedPrecisionPolicy(param_dtype=fp16, reduce_dtype=fp32), GradScaler" in r.stdout
    steps = [x for x in r.stdout.splitlines() if x.startswith("step")]
    assert [x.endswith(f"fp16 steps skipped {n}") for x, n in zip(steps, (0, 1, 1))] == [True] * 3, steps


def _tokens(tmp_path, vocab, n=20_000):
    ids = np.random.default_rng(0).integers(0, vocab, size=n, dtype=np.uint16)
    ids.tofile(tmp_path / "tokens.bin")
    return tmp_path / "tokens.bin"


@slow
def test_memmap_token_file(alone):
    _, r = alone["memmap"]
    checked(r)
    assert "tokens.bin (uint16 memmap; last 5%, 1,000 tokens, held out), 19,000 tokens" in r.stdout
    assert "tokenizer: unknown" in r.stdout and "sample: skipped" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_no_cuda_is_one_sentence(tmp_path, capsys):
    from train_gpu import main
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "o")])  # the default device is cuda
    assert "no CUDA GPU" in refusal(e, capsys)


def test_help_documents_the_exit_codes():
    from train_gpu import build_parser
    text = " ".join(build_parser().format_help().split())
    assert "75 stopped by SIGTERM/SIGUSR1" in text and "--shard {ddp,fsdp,hsdp}" in text
    assert "74 a checkpoint could not be saved" in text


def _bad_arguments():
    return [
        ("batch not a multiple", ["--global-batch-tokens", "1000"], "not a positive multiple of micro-batch"),
        ("heads do not divide d-model", ["--n-head", "3"], "heads of even size"),
        ("no layers", ["--n-layer", "0"], "--n-layer: '0' must be positive"),
        ("negative eval interval", ["--eval-every", "-1"], "--eval-every: '-1' is negative"),
        ("zero timeout", ["--timeout-s", "0"], "--timeout-s: '0' must be positive"),
        ("infinite timeout", ["--timeout-s", "inf"], "--timeout-s: 'inf' is not a number"),
        ("timeout past a timedelta", ["--timeout-s", "1e12"], "below 1e9 seconds"),
        ("nan clip", ["--grad-clip", "nan"], "--grad-clip: 'nan' is not a number"),
        ("infinite lr", ["--lr", "inf"], "--lr: 'inf' is not a number"),
        ("negative peak", ["--peak-tflops", "-5"], "--peak-tflops: '-5' is negative"),
        ("min lr ratio above 1", ["--min-lr-ratio", "7"], "--min-lr-ratio: '7' must lie between 0 and 1"),
        ("negative weight decay", ["--weight-decay", "-1"], "--weight-decay: '-1' is negative"),
        ("fractional steps", ["--steps", "2.5"], "--steps: '2.5' must be a whole number"),
        ("unknown scheme", ["--shard", "zero1"], "invalid choice"),
        ("resume and auto-resume", ["--resume", "--auto-resume"], "not allowed with"),
    ]


@pytest.mark.parametrize("extra, expect", [c[1:] for c in _bad_arguments()], ids=[c[0] for c in _bad_arguments()])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, extra, expect):
    from train_gpu import main
    with pytest.raises(SystemExit) as e:
        main(TINY + ["--micro-batch", "4", "--out", str(tmp_path / "o")] + extra)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and expect in err, err
    assert not (tmp_path / "o").exists()


def _bad_inputs():
    """(name, arrange(tmp) -> extra args, expected words in the one-line error, exit 1)."""
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
        ("resume without a checkpoint", lambda t: ["--resume", "--out", str(t / "o")], "no complete checkpoint"),
        ("--out is a file", file_at("f"), "is a file, not a folder"),
        ("--out under a file", file_at("f/run"), "which is a file, not a folder"),
        ("--out not writable", lambda t: ["--out", "/proc/self/run"], "not writable"),
        ("token file shorter than a sequence", tokens(20), "fewer than one sequence"),
        ("token file too short to hold out 5%", tokens(600), "held out for validation is shorter"),
        ("token file of odd size", lambda t: [(t / "x.bin").write_bytes(b"abc"), "--data", str(t / "x.bin")][1:],
         "not a uint16 token file"),
        ("missing token file", lambda t: ["--data", str(t / "none.bin")], "does not exist"),
        ("vocabulary below the book tokenizer's", lambda t: ["--vocab-size", "4096"],
         "--vocab-size 4,096 is smaller than the book's tokenizer's 8,192 ids"),
        ("token id beyond the vocabulary", lambda t: [(t / "tok.bin").write_bytes(np.full(4000, 600, np.uint16)
                                                                                  .tobytes()), "--data",
                                                      str(t / "tok.bin"), "--vocab-size", "512"][1:],
         "holds token id 600, beyond --vocab-size 512"),
        ("tokenizer that is not a model", lambda t: [(t / "tok.bin").write_bytes(b"\0" * 4000),
                                                     (t / "m").write_text("no"), "--data", str(t / "tok.bin"),
                                                     "--tokenizer", str(t / "m")][2:], "not a SentencePiece model"),
    ]


@pytest.mark.parametrize("arrange, expect", [c[1:] for c in _bad_inputs()], ids=[c[0] for c in _bad_inputs()])
def test_bad_input_is_one_sentence_before_any_work(tmp_path, capsys, arrange, expect):
    from train_gpu import main
    extra = arrange(tmp_path)
    if "--out" not in extra:
        extra += ["--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as e:
        main(TINY + ["--micro-batch", "4", "--steps", "2"] + extra)
    message = refusal(e, capsys)
    assert expect in message, message
    assert not (tmp_path / "o").exists()  # nothing started


def test_an_existing_checkpoint_needs_resume(tiny, tmp_path, capsys):
    out, _ = _copy_checkpoint(tiny, tmp_path)
    e = main_here(HERE + ["--out", str(out)], status=1)
    assert "exists; pass --resume" in refusal(e, capsys)


def test_ledger_prediction_matches_the_memory_module():
    from memory import Shape, run_peak_bytes
    from train_gpu import build_parser, ledger_mib, planned_run
    args = build_parser().parse_args(TINY + ["--checkpoint-activations"])
    run = planned_run(args, 2, 1, "bf16")
    assert run.shape == Shape(32, 2, 2, 32, args.micro_batch, args.vocab_size) and run.scheme == "ddp"
    assert ledger_mib(run, 300_000) == run_peak_bytes(run, 300_000)["total"] / 2**20
    assert ledger_mib(run, 300_000) < ledger_mib(planned_run(build_parser().parse_args(TINY), 2, 1, "bf16"), 300_000)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@slow
def test_two_nodes_with_c10d_rendezvous_match_one_node(runs):
    """Two torchrun "nodes" on this machine (one gloo process each) meet through c10d rendezvous on
    127.0.0.1: the same arithmetic as one node with 2 processes, so the same parameters, bitwise."""
    out, nodes = runs["two nodes"]
    outs = [(p.stdout, p.stderr) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    ref, two_nodes = weights(runs[2, "ddp"][0]), weights(out)
    assert all(torch.equal(ref[k], two_nodes[k]) for k in ref)


def requirements_train_modules() -> set:
    """The top-level modules a box gets from requirements-train.txt: its packages' and, transitively, those
    they require (importlib.metadata of this venv's same versions; a requirement whose marker does not
    hold here is not followed)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    lines = (REPO / "requirements-train.txt").read_text(encoding="utf-8").splitlines()
    todo, seen, modules = [x.split("==")[0] for x in lines if x.strip() and not x.startswith("#")], set(), set()
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        top = (dist.read_text("top_level.txt") or "").split() or [
            f.parts[0].removesuffix(".py") for f in dist.files or []
            if not f.parts[0].endswith((".dist-info", ".data"))]
        modules |= set(top)
        todo += [r.name for r in map(Requirement, dist.requires or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
    return modules


def test_train_gpu_imports_only_what_requirements_train_installs():
    """The reader copies code/ whole and installs requirements-train.txt: every module train_gpu.py imports,
    directly or through code/'s modules (imports inside functions included), is the standard library's,
    code/'s own, or torch's, numpy's or sentencepiece's."""
    import ast
    code = {p.stem for p in (REPO / "code").glob("*.py")}
    seen, todo, outside = set(), ["train_gpu"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((REPO / "code" / f"{name}.py").read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for top in (n.partition(".")[0] for n in names):
                if top in code:
                    todo.append(top)
                elif top not in sys.stdlib_module_names:
                    outside.add(top)
    assert outside <= {"torch", "numpy", "sentencepiece"} and outside <= requirements_train_modules(), outside


def test_requirements_train_pins_what_requirements_pins():
    def pins(name):
        lines = (REPO / name).read_text(encoding="utf-8").splitlines()
        return dict(line.split("==") for line in lines if line.strip() and not line.startswith("#"))
    train, book = pins("requirements-train.txt"), pins("requirements.txt")
    assert set(train) == {"torch", "numpy", "sentencepiece"}
    assert all(book[k] == v for k, v in train.items()), (train, {k: book.get(k) for k in train})


@slow  # trains the book's tokenizer in an empty folder, then 20 steps
def test_the_copied_files_alone_run_the_docstrings_cpu_smoke_command(tmp_path):
    import shlex

    import train_gpu
    box = tmp_path / "box"
    (box / "data").mkdir(parents=True)
    shutil.copytree(REPO / "code", box / "code", ignore=shutil.ignore_patterns("__pycache__"))  # code/ whole
    shutil.copy(REPO / "data" / "songci.txt", box / "data" / "songci.txt")
    # the same interpreter and versions, without site-packages (python -S): only what requirements-train.txt
    # installs is on the path, linked from this venv (what this cannot see: an install that fails on the box)
    from pathlib import Path
    site = Path(torch.__file__).resolve().parents[1]
    view = tmp_path / "site-packages"
    view.mkdir()
    allowed = {m.lower() for m in requirements_train_modules()}
    for entry in site.iterdir():
        if entry.name.split("-")[0].split(".")[0].lower().replace("-", "_") in allowed:
            (view / entry.name).symlink_to(entry)
    shutil.copy(REPO / "requirements-train.txt", box / "requirements-train.txt")
    doc = train_gpu.__doc__.replace("\\\n", " ")
    line = next(x for x in doc.splitlines() if "--device cpu" in x).split("#")[0]
    argv = shlex.split(line)
    assert argv[:2] == ["python", "code/train_gpu.py"]
    out = argv.index("--out") + 1
    argv[out] = str(tmp_path / "smoke")
    p = subprocess.run([sys.executable, "-S", *argv[1:]], cwd=box, env={**ENV, "PYTHONPATH": str(view)},
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "done: 20 steps" in p.stdout
    assert json.loads((tmp_path / "smoke" / "run.json").read_text(encoding="utf-8"))["exit_code"] == 0


AGREE = """
import json, signal, sys, types
import torch
import torch.distributed as dist
sys.path.insert(0, {code!r})
import train_gpu
dist.init_process_group("gloo")
rank = dist.get_rank()
now = [0.0]
flag = train_gpu.StopFlag(clock=lambda: now[0])
t = types.SimpleNamespace(device=torch.device("cpu"))
polls, stopped = [], None
for done in range(1, 31):
    now[0] += 1.0 + 2.0 * rank  # rank 1's clock says a step takes 3 s, rank 0's 1 s
    if done == 7 and rank == 1:
        flag.signum = signal.SIGTERM
    before = flag.polled
    if flag.agreed(t, done, poll=done == 20) and stopped is None:
        stopped = done
    if flag.polled is not before:
        polls.append(done)
open({out!r} + str(rank), "w").write(json.dumps([polls, stopped]))
dist.destroy_process_group()
"""


@slow  # two gloo processes
def test_processes_with_different_clocks_poll_at_the_same_steps(tmp_path):
    """Each poll agrees on the next one from the slowest process's pace: the same steps on every process,
    about STOP_POLL_S apart on the slower clock; a stop heard by one is agreed by both at one step."""
    from script_support import run_script
    script = tmp_path / "agree.py"
    script.write_text(AGREE.format(code=str(REPO / "code"), out=str(tmp_path / "rank")), encoding="utf-8")
    run_script(script, [], nproc=2, cwd=tmp_path, timeout_s=240)
    ranks = [json.loads((tmp_path / f"rank{r}").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1], ranks
    assert ranks[0] == [[1, 2, 3, 6, 9, 12, 15, 18, 20, 23, 26, 29], 9], ranks


@pytest.mark.parametrize("other, words", [((1, 100, -100), "is not one folder that every process sees"),
                                          ((0, 200, -100), "token files of 100 and 200 tokens")])
def test_an_out_or_data_not_every_process_sees_is_refused_in_one_sentence(tmp_path, capsys, monkeypatch, other,
                                                                          words):
    """check_shared_folders as rank 0 of 2, the other process's answer (it missed the file rank 0 wrote into
    --out, or read another token count) added by a stand-in for the all-reduce; the file is removed.
    tests/test_slurm.py runs it on two Slurm nodes with node-local disks."""
    import torch.distributed as dist

    import train_gpu
    calls = []

    def all_reduce(x, op=dist.ReduceOp.SUM):
        calls.append(op)
        if op == dist.ReduceOp.MAX:
            x.copy_(torch.maximum(x, torch.tensor(other)))
    monkeypatch.setattr(dist, "all_reduce", all_reduce)

    class Data:
        def __len__(self):
            return 100
    with pytest.raises(SystemExit) as e:
        train_gpu.check_shared_folders(tmp_path, Data(), torch.device("cpu"), 0, 2)
    assert words in refusal(e, capsys) and calls == [dist.ReduceOp.SUM, dist.ReduceOp.MAX]
    assert not list(tmp_path.glob(".shared-*"))
    monkeypatch.setattr(dist, "all_reduce", lambda x, op=None: None)  # every process saw it: nothing to say
    train_gpu.check_shared_folders(tmp_path, Data(), torch.device("cpu"), 0, 2)
    assert not list(tmp_path.glob(".shared-*"))
