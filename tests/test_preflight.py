"""train_gpu.py --preflight (code/preflight.py) judged against what the plan assumes, with a fake Trainer and
made-up measurements in this process: no GPU and no second process needed."""
import signal
from types import SimpleNamespace

import pytest
import torch

import budget
import preflight

H100 = "NVIDIA H100 80GB HBM3"  # 132 SMs: the SXM card on NVLink 4


def fake_trainer(out, precision="fp32", n_params=10_000, world=1, notice_s=30):
    """What preflight.run reads of train_gpu.py's Trainer: a CPU process, its run's precision, the model's size,
    the launcher's notice."""
    return SimpleNamespace(device=torch.device("cpu"), rank=0, world=world, precision=precision,
                           args=SimpleNamespace(shard="ddp", out=str(out), notice_s=notice_s),
                           raw=SimpleNamespace(num_params=lambda: n_params))


def test_across_machines_the_all_reduce_is_compared_with_the_network_the_budget_assumes():
    one = preflight.assumed(H100, 132, "bf16", world=8, local_world=8)
    two = preflight.assumed(H100, 132, "bf16", world=16, local_world=8)
    assert (one.nodes, one.link_bytes_s) == (1, budget.link_bytes_per_s(8, 450)) == (1, 450e9)
    assert (two.nodes, two.link_bytes_s) == (2, budget.link_bytes_per_s(16, 450)) == (2, 50e9)  # InfiniBand NDR
    # 40 GB/s of bus bandwidth: healthy over 2 × 8 H100s on the network, far too slow inside one machine
    warned, line = preflight.link_verdict(40.0, 64, two)
    assert not warned and "the budget assumes 50 GB/s per GPU over 2 machine(s)" in line and line.endswith("ok")
    warned, line = preflight.link_verdict(40.0, 64, one)
    assert warned and "450 GB/s" in line and line.endswith("WARN")
    assert two.link.startswith("2 machines: the network port")


def test_on_a_t4_the_matmul_is_timed_in_fp16_against_the_fp16_peak():
    t4 = preflight.assumed("Tesla T4", 40, "fp16", world=1, local_world=1)
    assert t4.gpu.name == "T4" and t4.dtype == torch.float16
    warned, line = preflight.matmul_verdict([50e12], 8192, t4, cuda=True)  # 77 % of 65: a healthy T4
    assert not warned and "matmul 8192³ fp16 per process" in line and "65 (fp16 dense peak)" in line
    h100 = preflight.assumed(H100, 132, "bf16", world=1, local_world=1)
    assert h100.dtype == torch.bfloat16
    warned, _ = preflight.matmul_verdict([400e12], 8192, h100, cuda=True)  # 40 % of 989
    assert warned


def test_the_preflight_times_the_runs_own_precision_and_warns_of_a_disk_too_small(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "CPU_MATMUL_N", 64)  # a 16-bit matmul on this CPU takes seconds at 1024
    lines = []
    warnings = preflight.run(fake_trainer(tmp_path, "fp16", n_params=10**14), 1.0, lines.append)  # 1.2 PB each
    assert any(x.startswith("  matmul 64³ fp16 per process") for x in lines), lines
    assert "ddp, fp16" in lines[0]
    assert warnings == 2 and lines[-1].startswith("preflight: 2 warning(s)"), lines  # save time and space


def test_the_save_budget_counts_the_stop_poll_and_the_disk_two_kept_checkpoints():
    gb = 1e9
    # 80 s to save: within half of Slurm's 170 s alone, not after 10 s of waiting for the ranks to agree
    assert preflight.disk_verdict(1 * gb, 1e6 * gb, 0, 80 * gb, stop_poll_s=0, notice_s=170)[0] == 0
    warned, lines = preflight.disk_verdict(1 * gb, 1e6 * gb, 0, 80 * gb, stop_poll_s=10, notice_s=170)
    assert warned == 1 and "after up to 10 s" in lines[0] and lines[0].endswith("WARN")
    # room for the two kept checkpoints and the next one: 3 parts, counting what is already in --out
    assert preflight.disk_verdict(10 * gb, 2.5 * gb, 0, 1 * gb, stop_poll_s=10, notice_s=170)[0] == 1
    assert preflight.disk_verdict(10 * gb, 2.5 * gb, 1 * gb, 1 * gb, stop_poll_s=10, notice_s=170)[0] == 0


def test_the_save_is_judged_against_the_launchers_notice_not_a_fixed_170_s():
    """A 40 s save after a 10 s poll: fits AWS's 2-minute notice (half: 60 s), not GCP spot's 30 s."""
    gb = 1e9
    aws = preflight.disk_verdict(1 * gb, 1e6 * gb, 0, 40 * gb, stop_poll_s=10, notice_s=120)
    gcp = preflight.disk_verdict(1 * gb, 1e6 * gb, 0, 40 * gb, stop_poll_s=10, notice_s=30)
    assert aws[0] == 0 and "(--notice-s) leaves 120 s" in aws[1][0] and aws[1][0].endswith("ok")
    assert gcp[0] == 1 and "(--notice-s) leaves 30 s" in gcp[1][0] and gcp[1][0].endswith("WARN")


def test_a_containers_small_dev_shm_warns_where_nccl_shares_a_machine(tmp_path, monkeypatch):
    warned, line = preflight.shm_verdict(64 * 2**20, 8, cuda=True)  # Docker's default under 8 GPUs
    assert warned and "0.06 GiB for 8 process(es)" in line and line.endswith("WARN")
    warned, line = preflight.shm_verdict(16 * 2**30, 8, cuda=True)
    assert not warned and line.endswith("ok")
    assert not preflight.shm_verdict(64 * 2**20, 1, cuda=True)[0]  # one process per machine: no NCCL peer there
    assert not preflight.shm_verdict(64 * 2**20, 8, cuda=False)[0]  # gloo on a CPU does not use it
    monkeypatch.setattr(preflight, "shm_bytes", lambda: 64 * 2**20)
    lines = []
    preflight.run(fake_trainer(tmp_path), 1.0, lines.append)
    assert any(x.startswith("  /dev/shm: 0.06 GiB") for x in lines), lines


def test_evaluation_memory_is_judged_beside_trainings():
    """The ledger's evaluation peak (forward with autograd on, no gradients being reduced) is below training's
    and above the state alone; a GPU whose free memory holds training but not evaluation warns."""
    from shapes import Run, Shape, run_peak_bytes
    run = Run(Shape(512, 8, 8, 512, 32, 8192), gpus=8, scheme="zero3", precision="bf16", accum=4)
    n = 30_000_000
    train, ev = run_peak_bytes(run, n)["total"] / 2**20, preflight.eval_peak_mib(run, n)
    assert 0 < ev < train, (ev, train)
    warned, lines = preflight.memory_verdict(free_mib=1.2 * train, train_mib=train, eval_mib=ev)
    assert warned == 0 and [x.split(":")[0] for x in lines] == ["  device memory for training",
                                                               "  device memory for evaluation"]
    warned, lines = preflight.memory_verdict(free_mib=1.0 * ev, train_mib=0.5 * ev, eval_mib=ev)
    assert warned == 1 and lines[1].endswith("WARN") and lines[0].endswith("ok")
    assert len(preflight.memory_verdict(1e6, train, None)[1]) == 1  # a run that does not evaluate


@pytest.mark.parametrize("notice_s, status", [("0.001", preflight.EXIT_WARNED), ("120", 0)])
def test_preflight_exits_with_its_status_when_it_warns(tmp_path, capsys, notice_s, status):
    """train_gpu.py --preflight in this process, with the launcher's notice as an argument: with no time at
    all after the stop signal the disk check warns, and the status says so (a launch script can stop before
    paying for the run); with 2 minutes every check passes on this CPU."""
    from train_gpu import main
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    tiny = ["--device", "cpu", "--d-model", "32", "--n-layer", "1", "--n-head", "2", "--seq-len", "32",
            "--micro-batch", "2", "--global-batch-tokens", "64", "--steps", "1", "--sample-tokens", "0"]
    try:
        with pytest.raises(SystemExit) as e:
            main([*tiny, "--out", str(tmp_path / "o"), "--preflight", "--notice-s", notice_s, "--eval-every", "1"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    out = capsys.readouterr().out
    assert e.value.code == status, out
    assert f"the launcher's notice (--notice-s) leaves {float(notice_s):g} s" in out and "  /dev/shm: " in out
    assert "for evaluation" in out, out
