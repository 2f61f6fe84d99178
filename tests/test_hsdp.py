"""HSDP (train_gpu.py --shard hsdp): FSDP2 on a 2-D mesh, sharded inside groups of --shard-size processes
and replicated across them. The ledger's arithmetic (memory.Run) and the script's refusals run in this
process; the slow tests train a tiny model on 4 gloo processes as 2 groups of 2: equal to one process,
and its checkpoints resharded to and from FSDP, DDP and one process, each ending where the
uninterrupted run ends (bitwise when resumed as it was saved). The bytes by link: test_run_witness.py."""
import shutil

import pytest
from test_train_gpu import RUN, TOL, checked, launch, max_diff, run, slow, train_log, weights
from together import run_together

import memory
import train_gpu

HSDP = ["--shard", "hsdp", "--shard-size", "2", "--micro-batch", "2"]  # 4 processes: 2 groups of 2
ON = {"fsdp2": (2, ["--shard", "fsdp", "--micro-batch", "4"]), "ddp2": (2, ["--shard", "ddp", "--micro-batch", "4"]),
      "one": (1, ["--micro-batch", "8"]), "hsdp4": (4, HSDP)}


# ---- the ledger ---------------------------------------------------------------------------------------

SEVEN_B = memory.Shape(4096, 32, 32, 4096, 1, 50304)


def test_hsdp_sends_one_all_reduce_of_the_shards_between_machines():
    """7B on 8 machines of 8: the all-gathers and reduce-scatters stay inside a machine; between machines
    only the all-reduce of the fp32 gradient shards, 2(R-1)/R × 4 bytes per padded shard number."""
    run = memory.Run(SEVEN_B, gpus=64, scheme="hsdp", precision="bf16", accum=4, shard_size=8, gpus_per_node=8)
    u = memory.unit_numels(run)
    shard = u["root"]["padded shard"] + 32 * u["block"]["padded shard"]
    by_link = memory.run_sent_by_link(run)
    assert by_link["network"] == 2 * 7 / 8 * 4 * shard
    assert by_link["node"] == sum(memory.run_sent_bytes(run).values()) - by_link["network"]
    n = memory.run_state_bytes(memory.Run(SEVEN_B))["grads"] // 4
    assert abs(shard - n / 8) / (n / 8) < 1e-3  # a shard group of 8 holds an eighth each
    zero3 = memory.Run(SEVEN_B, gpus=64, scheme="zero3", precision="bf16", accum=4, gpus_per_node=8)
    assert memory.run_sent_by_link(zero3)["node"] == 0  # every ZeRO-3 gather spans the 64
    assert by_link["network"] < memory.run_sent_by_link(zero3)["network"] / 10
    hsdp_state, zero3_state = memory.run_state_bytes(run), memory.run_state_bytes(zero3)
    assert hsdp_state["optimizer"] == pytest.approx(8 * zero3_state["optimizer"], rel=2e-3)  # G/shard-size times


def test_hsdp_on_one_machine_is_zero3_and_groups_of_one_gather_nothing():
    s = memory.Shape(64, 2, 2, 32, 2, 8192)
    hsdp = memory.Run(s, gpus=8, scheme="hsdp", precision="bf16", accum=2, shard_size=8)
    zero3 = memory.Run(s, gpus=8, scheme="zero3", precision="bf16", accum=2)
    assert memory.run_messages(hsdp) == memory.run_messages(zero3)
    assert memory.run_state_bytes(hsdp) == memory.run_state_bytes(zero3)
    assert memory.run_peak_bytes(hsdp) == memory.run_peak_bytes(zero3)
    ones = memory.Run(s, gpus=8, scheme="hsdp", precision="bf16", accum=2, shard_size=1)
    messages = memory.run_messages(ones)
    assert messages["all_gather"] == messages["reduce_scatter"] == [0, 0] and messages["all_reduce"][0] == 3


def test_hsdp_every_micro_batch_holds_the_partial_sums_not_the_whole_gradients():
    s = memory.Shape(64, 2, 2, 32, 2, 8192)
    last = memory.Run(s, gpus=4, scheme="hsdp", precision="bf16", accum=4, shard_size=2)
    every = memory.Run(s, gpus=4, scheme="hsdp", precision="bf16", accum=4, shard_size=2, sync_every=True)
    assert memory.run_state_bytes(last)["whole grads"] > 0 and memory.partial_reduce_bytes(last) == 0
    assert memory.run_state_bytes(every)["whole grads"] == 0
    assert memory.partial_reduce_bytes(every) == memory.run_messages(every)["all_reduce"][1]  # one fp32 shard each
    assert memory.run_messages(every)["all_reduce"] == memory.run_messages(last)["all_reduce"]  # once per step
    assert memory.run_messages(every)["reduce_scatter"][0] == 4 * memory.run_messages(last)["reduce_scatter"][0]


# ---- the script's refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize("extra, local, world, expect", [
    (["--shard", "hsdp", "--shard-size", "3"], 4, 4, "--shard-size 3 must divide the 4 processes of a machine"),
    (["--shard", "hsdp", "--shard-size", "4"], 2, 4, "--shard-size 4 must divide the 2 processes of a machine"),
    (["--shard", "fsdp", "--shard-size", "2"], 4, 4, "--shard-size is for --shard hsdp"),
    (["--shard", "hsdp", "--no-reshard-after-forward"], 4, 4, "--no-reshard-after-forward is for --shard fsdp"),
])
def test_a_shard_size_that_does_not_fit_the_machines_is_one_line_exit_2(monkeypatch, capsys, extra, local, world,
                                                                        expect):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    args = train_gpu.build_parser().parse_args(["--micro-batch", "2", "--seq-len", "32", "--global-batch-tokens",
                                                "512", *extra])
    with pytest.raises(SystemExit) as e:
        train_gpu.check_args(args, world)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and expect in err[0], err


def test_the_default_shard_group_is_a_machine(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    args = train_gpu.build_parser().parse_args(["--shard", "hsdp", "--micro-batch", "2", "--seq-len", "32",
                                                "--global-batch-tokens", "512"])
    assert train_gpu.check_args(args, 4) == 2 and args.shard_size == 2
    run = train_gpu.planned_run(args, 4, 2, "fp32")
    assert (run.scheme, run.shard_group, run.replicas, run.gpus_per_node) == ("hsdp", 2, 2, 2)


# ---- trained on 4 processes, resharded ----------------------------------------------------------------

@pytest.fixture(scope="module")
def hsdp_runs(tmp_path_factory):
    """One process; HSDP 2×2 uninterrupted; HSDP 2×2 stopped (a SIGTERM at step 4) with its checkpoint."""
    outs, launches = {}, {}
    for name, nproc, flags, faults in (("hsdp", 4, HSDP, None), ("stopped", 4, HSDP, "stop=4"),
                                       ("one", 1, ON["one"][1], None)):
        outs[name] = tmp_path_factory.mktemp(name)
        launches[name] = launch(RUN + flags + ["--out", str(outs[name])], nproc=nproc, faults=faults)
    ran = run_together(launches)
    return {name: (outs[name], (checked(r) if name != "stopped" else r).stdout) for name, r in ran.items()}


@slow
def test_hsdp_ends_with_the_parameters_of_one_process(hsdp_runs):
    out, stdout = hsdp_runs["hsdp"]
    assert "HSDP over 4 processes: FSDP2 sharded over 2 and replicated 2×" in stdout
    assert "all-reduce" in stdout  # the start line's bytes sent: the shards' all-reduce across the groups
    diff = max_diff(weights(hsdp_runs["one"][0]), weights(out))
    print(f"HSDP 2×2: max |Δθ| = {diff:.2e} against 1 process")
    assert diff < TOL, diff


def resume(hsdp_runs, tmp_path, on: str, source="stopped", faults=None, now=True):
    """The stopped run's checkpoint (or source's) copied and resumed on `on`; with now=False, the launch
    to start (run_together) instead of the run's (out, stdout)."""
    nproc, flags = ON[on]
    out = tmp_path / f"resumed-{on}"
    shutil.copytree(hsdp_runs[source][0] if isinstance(source, str) else source, out, dirs_exist_ok=True)
    args = RUN + flags + ["--resume", "--out", str(out)]
    if not now:
        return out, launch(args, nproc=nproc, faults=faults)
    r = run(args, nproc=nproc, check=faults is None, faults=faults)
    return out, r.stdout


@pytest.fixture(scope="module")
def resumed(hsdp_runs, tmp_path_factory):
    """The stopped HSDP checkpoint resumed as saved, under DDP, on one process and under FSDP on 2 (with a
    stop at step 6), each from its own copy, started together: {on: (out, stdout)}."""
    outs, launches = {}, {}
    for on, faults in (("hsdp4", None), ("fsdp2", "stop=6"), ("ddp2", None), ("one", None)):
        outs[on], launches[on] = resume(hsdp_runs, tmp_path_factory.mktemp(on), on, faults=faults, now=False)
    ran = run_together(launches)
    return {on: (outs[on], (checked(r) if on != "fsdp2" else r).stdout) for on, r in ran.items()}


@slow
def test_hsdp_checkpoint_resumed_as_saved_is_bitwise(hsdp_runs, resumed):
    out, stdout = resumed["hsdp4"]
    assert "saved by 4 process(es), hsdp" in stdout
    ref, resumed = weights(hsdp_runs["hsdp"][0]), weights(out)
    assert all((ref[k] == resumed[k]).all() for k in ref)
    assert [x["train_loss"] for x in train_log(out)] == [x["train_loss"] for x in train_log(hsdp_runs["hsdp"][0])]


@slow
@pytest.mark.parametrize("on", ["ddp2", "one"])
def test_hsdp_checkpoint_resumes_under_ddp_and_one_process(hsdp_runs, resumed, on):
    out, _ = resumed[on]
    diff = max_diff(weights(hsdp_runs["one"][0]), weights(out))
    print(f"saved HSDP 2×2 at step 4, resumed {on}: max |Δθ| = {diff:.2e}")
    assert diff < TOL, diff


@slow
def test_hsdp_to_fsdp_and_back(hsdp_runs, resumed, tmp_path):
    """Saved under HSDP at step 4, resumed under FSDP on 2 processes and stopped again at 6, resumed
    under HSDP to the end."""
    mid, stdout = resumed["fsdp2"]
    assert "stopped by SIGTERM after step 6" in stdout
    out, stdout = resume(hsdp_runs, tmp_path, "hsdp4", source=mid)
    assert "saved by 2 process(es), fsdp" in stdout
    diff = max_diff(weights(hsdp_runs["one"][0]), weights(out))
    print(f"HSDP → FSDP 2 (steps 4-6) → HSDP (6-8): max |Δθ| = {diff:.2e} against 1 process")
    assert diff < TOL, diff
