"""code/ddp_train.py with two gloo processes: equal to one process, rank-0-only saving, fast failure,
and the two silent bugs it demonstrates (no_sync around backward only; per-rank data order)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from together import run_together

from arguments import run_main
from ddp_train import checkpoint_difference
from script_support import run_script

SCRIPT = str(Path(__file__).resolve().parent.parent / "code" / "ddp_train.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SMALL = ["--steps", "6", "--global-batch", "4", "--seq-len", "32", "--d-model", "32", "--n-layer", "1",
         "--n-head", "2", "--clip", "0", "--log-every", "3"]


def run(tmp_path, args, nproc=None):
    p = run_script(SCRIPT, [*SMALL, *args], nproc=nproc, cwd=tmp_path, env=ENV, check=False, timeout_s=120)
    return p, p.seconds


max_diff = checkpoint_difference


def launch(d, args, nproc=None):
    """(argv, workers, env, cwd) of the command run() runs (script_support.run_script's), to start together."""
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [sys.executable, *launcher, SCRIPT, *SMALL, *args], nproc or 1, ENV, d


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp")
    counted = ["--accum", "2", "--count-all-reduce", "--bucket-mb", "0.01"]  # small buckets: several of them
    out = run_together({"ddp": launch(d, [*counted, "--out", "ddp.pt"], nproc=2),
                        "wrong": launch(d, [*counted, "--backward-only-no-sync", "--out", "wrong.pt"], nproc=2),
                        "same": launch(d, ["--same-data", "--out", "same.pt"], nproc=2),
                        "single": launch(d, ["--out", "single.pt"])}, timeout=120)
    for p in out.values():
        assert p.returncode == 0, p.stderr[-2000:]
    return d, out


def test_two_ranks_with_accumulation_equal_one_process(runs):
    d, _ = runs
    assert max_diff(d / "single.pt", d / "ddp.pt") < 1e-4


def test_same_data_on_both_ranks_is_caught(runs):
    d, _ = runs
    assert max_diff(d / "single.pt", d / "same.pt") > 1e-3


def test_only_rank0_logs_and_saves_a_plain_state_dict(runs):
    d, out = runs
    assert sorted(p.name for p in d.iterdir()) == ["ddp.pt", "same.pt", "single.pt", "wrong.pt"]  # no temp files
    log = out["ddp"].stdout
    assert log.count("step   6") == 1 and "rank 1: parameters" in log  # rank 0 prints everyone's share
    ckpt = torch.load(d / "ddp.pt")
    assert not any(k.startswith("module.") for k in ckpt["model"])
    from model import GPT, GPTConfig
    GPT(GPTConfig(**ckpt["config"])).load_state_dict(ckpt["model"])


def all_reduces_after_step_1(stdout):
    """(calls, buckets, micro-batches) per step from steps 2 on (DDP regroups its buckets in step 1)."""
    m = re.search(r"all-reduce calls per step: (\d+) \(buckets (\d+) × micro-batches (\d+)\), steps 2-6", stdout)
    assert m, stdout
    return tuple(int(v) for v in m.groups())


def test_no_sync_around_backward_only_all_reduces_every_micro_batch(runs):
    d, out = runs
    calls, buckets, synced = all_reduces_after_step_1(out["ddp"].stdout)
    assert buckets > 1 and synced == 1 and calls == buckets  # one round of buckets per optimizer step
    assert all_reduces_after_step_1(out["wrong"].stdout) == (2 * buckets, buckets, 2)  # one per micro-batch
    assert max_diff(d / "ddp.pt", d / "wrong.pt") < 1e-4  # the bug costs communication, not correctness


def test_data_order_under_distributed_sampler_and_without_it(tmp_path):
    p, seconds = run(tmp_path, ["--show-data-order", "--out", "order.pt"], nproc=2)
    assert p.returncode == 0, p.stderr[-2000:]
    orders = torch.load(tmp_path / "order.pt")  # {scheme: [[rank 0's indices, rank 1's] per epoch]}
    for scheme in ("sampler + set_epoch", "sampler, no set_epoch"):
        for r0, r1 in orders[scheme]:
            assert not set(r0) & set(r1) and sorted(r0 + r1) == list(range(16))  # disjoint, covering
    epochs = [r0 + r1 for r0, r1 in orders["sampler + set_epoch"]]
    assert epochs[0] != epochs[1] != epochs[2]
    assert all(e == orders["sampler, no set_epoch"][0] for e in orders["sampler, no set_epoch"])
    assert orders["sampler, no set_epoch"][0] == orders["sampler + set_epoch"][0]
    assert all(r0 == r1 and sorted(r0) == list(range(16)) for r0, r1 in orders["shuffle=True, no sampler"])
    assert seconds < 60


def test_windows_are_consecutive_and_shifted_by_one():
    from ddp_train import Windows
    data = Windows(torch.arange(33), 8)
    assert len(data) == 4
    x, y = data[1]
    assert x.tolist() == list(range(8, 16)) and y.tolist() == list(range(9, 17))


def test_a_crashing_rank_ends_the_launch_fast(tmp_path):
    p, seconds = run(tmp_path, ["--crash-rank", "1", "--fail-step", "1"], nproc=2)
    assert p.returncode != 0 and "crashed on purpose" in p.stderr
    assert seconds < 60


def test_a_stuck_rank_times_out_instead_of_hanging(tmp_path):
    p, seconds = run(tmp_path, ["--hang-rank", "1", "--fail-step", "1", "--timeout", "3"], nproc=2)
    assert p.returncode != 0 and "Timed out" in p.stderr
    assert seconds < 60


def test_bad_batch_split_is_one_clear_error(tmp_path):
    p, _ = run(tmp_path, ["--global-batch", "3", "--slices", "2"])
    assert p.returncode != 0
    assert p.stderr.strip() == "error: --global-batch 3 does not divide into 2 slices"


# ---- --bench-all-reduce: the timing and the ring model fitted to it ----

def test_bench_all_reduce_times_every_size_on_two_ranks(tmp_path):
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", SCRIPT,
                        "--bench-all-reduce", "--sizes", "64k,4k", "--repeats", "2", "--rounds", "2",
                        "--out", "bench.pt"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    saved = torch.load(tmp_path / "bench.pt")
    assert saved["world"] == 2 and saved["sizes"] == [64_000, 4_000] and saved["rounds"] == 2
    assert [len(ts) for ts in saved["times_s"]] == [4, 4] and all(t > 0 for ts in saved["times_s"] for t in ts)
    rows = [line.split()[0] for line in p.stdout.splitlines() if line.endswith(" ms")]
    assert rows == ["64,000", "4,000"] and p.stdout.count("fit t = α") == 1  # printed by rank 0 only


def test_bench_all_reduce_needs_two_processes(tmp_path):
    p, _ = run(tmp_path, ["--bench-all-reduce"])
    assert p.returncode == 2 and p.stderr.strip().startswith("error: --bench-all-reduce needs at least 2 processes")


@pytest.mark.parametrize("text", ["4k,6", "0", "4k,x"])
def test_bench_sizes_must_be_whole_fp32_values(text):
    # refused by the parser, before any process group: main here, as the shell would see it (run_main)
    import ddp_train
    returncode, _, stderr = run_main(ddp_train.main, [*SMALL, "--bench-all-reduce", "--sizes", text])
    assert returncode == 2 and len(stderr.strip().splitlines()) == 1 and "--sizes" in stderr


def test_ring_bytes_is_two_n_minus_one_over_n():
    from ddp_train import ring_bytes
    assert ring_bytes(1e6, 2) == pytest.approx(1e6)  # two ranks: each sends half, then receives half back
    assert ring_bytes(1e6, 4) == pytest.approx(1.5e6)
    assert ring_bytes(1e6, 1) == 0


@pytest.mark.parametrize("world", [2, 8])
def test_fit_ring_recovers_the_model_it_is_given(world):
    from ddp_train import fit_ring, ring_time
    sizes = [4_000 * 4**k for k in range(8)]
    alpha, bandwidth = fit_ring(sizes, [ring_time(b, world, 2e-4, 1.5e9) for b in sizes], world)
    assert alpha == pytest.approx(2e-4, rel=1e-9) and bandwidth == pytest.approx(1.5e9, rel=1e-9)


def test_fit_ring_weighs_sizes_by_relative_error():
    from ddp_train import fit_ring, ring_time
    sizes = [4_000 * 4**k for k in range(8)]
    times = [ring_time(b, 2, 2e-4, 1.5e9) for b in sizes]
    times[0] *= 1.1  # 10 % off at the smallest size moves α by a few percent, not by orders of magnitude
    alpha, _ = fit_ring(sizes, times, 2)
    assert 2e-4 < alpha < 2.2e-4


def test_all_reduce_summary_splits_the_run_into_alternate_rounds():
    from ddp_train import all_reduce_summary, ring_time
    sizes = [1_000_000, 4_000]
    exact = [ring_time(b, 2, 1e-4, 1e9) for b in sizes]
    # 4 rounds of 2 calls; in the odd rounds every call of the small size waited (3×), in the even
    # rounds one of two did (5×): the fastest calls are the model's, the median is not
    times = [[exact[0]] * 8, [exact[1], 5 * exact[1], 3 * exact[1], 3 * exact[1]] * 2]
    s = all_reduce_summary(sizes, times, 2, rounds=4)
    assert s["fastest"] == exact and s["medians"][1] == pytest.approx(3 * exact[1])
    assert s["halves"] == [(exact[0], exact[0]), (exact[1], 3 * exact[1])]
    assert s["noise"] == pytest.approx([1.0, 3.0])
    assert s["alpha"] == pytest.approx(1e-4) and s["bandwidth"] == pytest.approx(1e9)
    assert s["crossover"] == pytest.approx(s["alpha"] * s["bandwidth"])  # two ranks: 2(N-1)/N = 1
