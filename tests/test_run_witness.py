"""The three counts agree: memory.Run's description of a run, and what train_gpu.py's own step sends and
holds on 2 and 4 gloo processes (code/run_witness.py hooks its collectives from outside the script); and,
launched as two machines of two processes, which of HSDP's messages cross between the machines."""
import json
import os
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "code"))
from together import run_together  # noqa: E402

import memory  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WITNESS = REPO / "code" / "run_witness.py"


def described(record: dict, world: int, gpus_per_node: int | None = None) -> tuple:
    """(run, messages, held) that memory.Run gives for one witnessed run."""
    c, tiny = record["combo"], record["tiny"]
    shape = memory.Shape(tiny["d_model"], tiny["n_layer"], tiny["n_head"], tiny["seq_len"], tiny["micro_batch"],
                         tiny["vocab_size"])
    run = memory.Run(shape, gpus=world, scheme=c["scheme"], precision=c["precision"], accum=c["accum"],
                     sync_every=c["sync_every"], checkpoint=c["checkpoint"], bucket_view=c["bucket_view"],
                     kernels="cpu", shard_size=record["hsdp_shard"] if c["scheme"] == "hsdp" else None,
                     gpus_per_node=gpus_per_node)
    state = memory.run_state_bytes(run)
    held = {**state, "gathered weights": memory.gathered_bytes(run), "partial reduce": memory.partial_reduce_bytes(run)}
    return run, memory.run_messages(run), held


def check(record: dict, world: int, gpus_per_node: int | None = None) -> list:
    """Compare every witnessed run with its description; return the HSDP runs' bytes by link."""
    assert record["world"] == world
    links = []
    for r in record["runs"]:
        run, messages, held = described({**r, "tiny": record["tiny"], "hsdp_shard": record["hsdp_shard"]}, world,
                                        gpus_per_node)
        assert r["n_params"] == memory.run_state_bytes(memory.Run(memory.Shape(32, 2, 2, 32, 2, 8192)))["grads"] // 4
        assert r["sent"] == messages, r["combo"]
        assert r["held"] == held, r["combo"]
        sizes = memory.group_sizes(run)
        for k, groups in r["groups"].items() if run.sharded else ():  # FSDP2's: over which ranks, which machines
            assert {len(g) for g in groups} == ({sizes[k]} if messages[k][0] else set()), (r["combo"], k)
            if gpus_per_node:
                spans = any(len({rank // gpus_per_node for rank in g}) > 1 for g in groups)
                assert spans == memory.crosses_nodes(run, k), (r["combo"], k, groups)
        if run.scheme == "hsdp":
            links.append((r["combo"], memory.run_sent_by_link(run)))
    return links


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def witnessed(tmp_path_factory):
    """The witness's runs, started together: on 2 and on 4 processes of one launch (what run_script
    starts), and on two launches of 2 processes that meet through c10d on 127.0.0.1, as launch/ starts two
    machines (both launches first, so that neither waits for the other's slots):
    {2: (path, CompletedProcess), 4: ..., "two machines": (path, [the two launches' CompletedProcess])}."""
    d = tmp_path_factory.mktemp("witness")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    port, two = _free_port(), d / "two-machines.json"
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"witness{port}",
            "--rdzv-conf", "join_timeout=30", str(WITNESS), "--out", str(two), "--schemes", "hsdp", "ddp"]

    def one_launch(world):
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                str(WITNESS), "--out", str(d / f"witness{world}.json")], world, env, REPO
    ran = run_together({"node 0": (node, 2, env, REPO), "node 1": (node, 2, env, REPO),
                        4: one_launch(4), 2: one_launch(2)}, timeout=300)
    return {2: (d / "witness2.json", ran[2]), 4: (d / "witness4.json", ran[4]),
            "two machines": (two, [ran["node 0"], ran["node 1"]])}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_the_description_equals_the_counted_bytes(witnessed, world):
    out, p = witnessed[world]
    assert p.returncode == 0, f"run_witness.py exited with {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}"
    record = json.loads(out.read_text())
    check(record, world)
    assert any(r["combo"]["scheme"] == "hsdp" for r in record["runs"]) == (world == 4)


@pytest.mark.slow
def test_hsdp_on_two_machines_sends_only_the_all_reduce_between_them(witnessed):
    """Two torchrun launches of 2 processes meet through c10d on 127.0.0.1, as launch/ starts two machines:
    HSDP's all-gathers and reduce-scatters stay inside each launch, its all-reduce crosses, byte for byte as
    memory.run_sent_by_link splits them."""
    out, nodes = witnessed["two machines"]
    outs = [(p.stdout, p.stderr) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    record = json.loads(out.read_text())
    assert record["gpus_per_node"] == 2
    links = check(record, 4, gpus_per_node=2)
    assert len(links) == 3
    for combo, by_link in links:
        print(combo, {k: f"{v:,.0f} B" for k, v in by_link.items()})
        assert by_link["network"] > 0 and by_link["node"] > by_link["network"]
