"""The three counts agree: memory.Run's description of a run, and what train_gpu.py's own step sends and
holds on 2 and 4 gloo processes (code/run_witness.py hooks its collectives from outside the script)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "code"))
import memory  # noqa: E402
from script_support import run_script  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def described(record: dict, world: int) -> tuple:
    """(messages, held) that memory.Run gives for one witnessed run."""
    c, tiny = record["combo"], record["tiny"]
    shape = memory.Shape(tiny["d_model"], tiny["n_layer"], tiny["n_head"], tiny["seq_len"], tiny["micro_batch"],
                         tiny["vocab_size"])
    run = memory.Run(shape, gpus=world, scheme=c["scheme"], precision=c["precision"], accum=c["accum"],
                     sync_every=c["sync_every"], checkpoint=c["checkpoint"], bucket_view=c["bucket_view"],
                     kernels="cpu")
    state = memory.run_state_bytes(run)
    held = {**state, "gathered weights": memory.gathered_bytes(run)}
    return memory.run_messages(run), held


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_the_description_equals_the_counted_bytes(tmp_path, world):
    out = tmp_path / "witness.json"
    run_script(REPO / "code" / "run_witness.py", ["--out", str(out)], nproc=world, cwd=REPO,
               timeout_s=240)
    record = json.loads(out.read_text())
    assert record["world"] == world
    for r in record["runs"]:
        messages, held = described({**r, "tiny": record["tiny"]}, world)
        assert r["n_params"] == memory.run_state_bytes(memory.Run(memory.Shape(32, 2, 2, 32, 2, 8192)))["grads"] // 4
        assert r["sent"] == messages, r["combo"]
        assert r["held"] == held, r["combo"]
