import subprocess
import sys

import pytest

import budget
from data import REPO
from model import GPT, GPTConfig

SCRIPT = str(REPO / "code" / "budget.py")

# the book's reference table, figure for figure
SPEC_TABLE = """\
| model | tokens | FLOPs | GPUs | hours | state DDP | state FSDP | activations |
|---|---|---|---|---|---|---|---|
| 124M (GPT-2; h 768, L 12, s 1024, b 16) | 2.5B | 1.8e18 | 1 | 1.3 | 2.0 GB | 1.98 GB | 5.1 GB |
| 1.3B (h 2048, L 24, s 2048, b 8) | 26.0B | 2.0e20 | 8 | 17.8 | 20.8 GB | 2.60 GB | 27.4 GB |
| 7B (h 4096, L 32, s 4096, b 2) | 140.0B | 5.9e21 | 64 | 64.5 | 112.0 GB | 1.75 GB | 36.5 GB |"""


def cli(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_no_arguments_prints_the_reference_table():
    r = cli()
    assert r.returncode == 0 and r.stderr == ""
    assert SPEC_TABLE in r.stdout


def cells(text):
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]


@pytest.mark.parametrize("row", range(3))
def test_every_cell_is_computed(row):
    want = cells(SPEC_TABLE)[row]
    got = cells(budget.reference_table())[row]
    for w, g in zip(want, got, strict=True):
        assert w == g
    # and the numbers behind the cells, from the formulas
    r = budget.reference_rows()[row]
    sc = r["scenario"]
    assert r["tokens"] == 20 * sc.n_params and r["flops"] == 6 * sc.n_params * r["tokens"]
    assert r["hours"] == pytest.approx(r["flops"] / (sc.gpus * 989e12 * 0.4) / 3600)
    assert r["state_ddp"] == 16 * sc.n_params and r["state_fsdp"] == pytest.approx(16 * sc.n_params / sc.gpus)
    assert r["activations"] == 34 * sc.seq_len * sc.micro_batch * sc.d_model * sc.n_layer


def test_zero_stages_interpolate_between_ddp_and_fsdp():
    n, g = 1e9, 8
    ddp, z1, z2, z3 = (budget.state_bytes(n, g, s) for s in ("ddp", "zero1", "zero2", "zero3"))
    assert ddp == 16e9 and z1 == pytest.approx(4e9 + 12e9 / 8) and z2 == pytest.approx(2e9 + 14e9 / 8)
    assert z3 == pytest.approx(2e9) and ddp > z1 > z2 > z3
    assert budget.state_bytes(n, 1, "zero3") == ddp  # one GPU: nothing to split


def test_book_claims_about_the_table():
    usable = 0.9 * 80e9
    rows = budget.reference_rows()
    small, mid, big = rows
    assert small["state_ddp"] + small["activations"] < usable and 1 < small["hours"] < 2
    assert mid["hours"] < 24 and mid["state_ddp"] + mid["activations"] < usable
    assert mid["state_ddp"] + 2 * mid["activations"] > usable  # micro-batch cannot double
    assert big["state_ddp"] > 80e9 and big["state_fsdp"] + big["activations"] < usable


def test_params_derived_from_shape_are_the_books_model():
    assert budget.params_of(512, 8) == GPT(GPTConfig(d_model=512, n_layer=8, n_head=8)).num_params() == 29_106_688


def test_reader_case_on_the_command_line():
    r = cli("--params", "1B", "--gpus", "8", "--gpu", "h100", "--d-model", "2048", "--n-layer", "20",
            "--seq-len", "2048", "--micro-batch", "8", "--price-per-gpu-hour", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "6·N·D = 1.20e20 FLOPs" in out and "20.0B tokens" in out
    assert "10.53 hours" in out and "84.3 GPU-hours" in out and "cost        169" in out
    ddp = next(line for line in out.splitlines() if line.strip().startswith("DDP"))
    assert ddp.split()[1:4] == ["16.00", "22.82", "38.82"] and "yes" in ddp
    assert "verdict     fits under DDP" in out


def test_seven_b_on_eight_gpus_needs_sharding():
    est = budget.estimate(7e9, 8, 989e12, 0.4, 140e9, 80, 4096, 2, 4096, 32)
    fits = {s: m["fits"] for s, m in est["memory"].items()}
    assert fits == {"ddp": False, "zero1": False, "zero2": True, "zero3": True}
    assert "fits under ZeRO-2 (not under plain DDP)" in budget.report(est, "H100", 989e12, 0.4, 80)


@pytest.mark.parametrize("args,message", [
    (["--params", "-1e9"], "negative"),
    (["--params", "0"], "must be positive"),
    (["--params", "lots"], "is not a number"),
    (["--params", "1e9", "--mfu", "1.2"], "is over 1"),
    (["--params", "1e9", "--gpus", "2.5"], "whole number"),
    (["--params", "1e9", "--gpu", "V100"], "unknown GPU 'V100'; known: B200"),
    (["--gpus", "8"], "give the model size"),
])
def test_bad_input_is_one_sentence(args, message):
    with pytest.raises(SystemExit) as e:
        budget.main(args)
    assert e.value.code == 2
    r = cli(*args)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1 and r.stdout == ""
