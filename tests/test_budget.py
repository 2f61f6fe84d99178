import math
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest

import budget
import gpus
import memory
from arguments import run_main
from data import REPO
from model import GPT, GPTConfig
from shapes import param_count

SCRIPT = str(REPO / "code" / "budget.py")

# the book's reference table, figure for figure
SPEC_TABLE = """\
| model | tokens | FLOPs | GPUs | hours | state DDP | state FSDP | activations |
|---|---|---|---|---|---|---|---|
| 124M (GPT-2; h 768, L 12, s 1024, b 16) | 2.5B | 1.8e18 | 1 | 1.3 | 2.0 GB | 1.98 GB | 5.1 GB |
| 1.3B (h 2048, L 24, s 2048, b 8) | 26.0B | 2.0e20 | 8 | 17.8 | 20.8 GB | 2.60 GB | 27.4 GB |
| 7B (h 4096, L 32, s 4096, b 2) | 140.0B | 5.9e21 | 64 | 64.5 | 112.0 GB | 1.75 GB | 36.5 GB |"""


def cli(*args):
    """budget.py's command line run in this process (arguments.run_main): its status, stdout and stderr."""
    code, out, err = run_main(budget.main, list(args))
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def script(*args):
    """budget.py run as a reader runs it, in an interpreter of its own."""
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_no_arguments_prints_the_reference_table():
    r = script()
    assert r.returncode == 0 and r.stderr == ""
    assert SPEC_TABLE in r.stdout
    assert budget.corrected_table() in r.stdout
    assert r.stdout == cli().stdout  # the script prints what main prints in process


def cells(text):
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]


@pytest.mark.parametrize("row", range(3))
def test_every_cell_of_the_rule_of_thumb_is_computed(row):
    want = cells(SPEC_TABLE)[row]
    got = cells(budget.rule_of_thumb_table())[row]
    for w, g in zip(want, got, strict=True):
        assert w == g
    # and the numbers behind the cells, from the rule's formulas
    r = budget.rule_of_thumb_rows()[row]
    sc = r["scenario"]
    assert r["tokens"] == 20 * sc.n_params and r["flops"] == 6 * sc.n_params * r["tokens"]
    assert r["hours"] == pytest.approx(r["flops"] / (sc.gpus * 989e12 * 0.4) / 3600)
    assert r["state_ddp"] == 16 * sc.n_params and r["state_fsdp"] == pytest.approx(16 * sc.n_params / sc.gpus)
    assert r["activations"] == 34 * sc.seq_len * sc.micro_batch * sc.d_model * sc.n_layer


@pytest.mark.parametrize("row", range(3))
def test_corrected_rows_come_from_the_ledger(row):
    r = budget.corrected_rows()[row]
    sc = r["scenario"]
    shape = sc.shape()
    assert r["n_params"] == param_count(sc.d_model, sc.n_layer, 50257)
    assert r["flops"] == (6 * r["n_params"] + 12 * sc.n_layer * sc.seq_len * sc.d_model) * r["tokens"]
    assert 0.10 < r["attention_share"] < 0.20  # not negligible
    # DDP as train_gpu.py runs it (gradients as views of its buckets): the textbook's step, less the
    # gradients, which with one micro-batch do not exist yet when its activations peak
    textbook = memory.step_bytes(shape, r["n_params"], sc.gpus, "ddp")
    assert r["total_ddp"] == textbook["total"] - textbook["grads"]
    run = memory.Run(shape, gpus=sc.gpus, scheme="zero3", precision="bf16")
    assert r["parts_fsdp"] == memory.run_peak_bytes(run, r["n_params"])
    # the logits the rule leaves out: at GPT-2 124M they are about as large as all other activations
    if row == 0:
        assert 0.8 < r["logits"] / r["activations"] < 1.5


def test_book_claims_about_the_rule_of_thumb():
    usable = 0.9 * 80e9
    small, mid, big = budget.rule_of_thumb_rows()
    assert small["state_ddp"] + small["activations"] < usable and 1 < small["hours"] < 2
    assert mid["hours"] < 24 and mid["state_ddp"] + mid["activations"] < usable
    assert mid["state_ddp"] + 2 * mid["activations"] > usable  # micro-batch cannot double
    assert big["state_ddp"] > 80e9 and big["state_fsdp"] + big["activations"] < usable


def test_params_derived_from_shape_are_the_books_model():
    assert param_count(512, 8, 8192) == GPT(GPTConfig(d_model=512, n_layer=8, n_head=8)).num_params() == 29_106_688


def test_reader_case_on_the_command_line():
    r = cli("--gpus", "8", "--gpu", "h100", "--d-model", "2048", "--n-layer", "20",
            "--seq-len", "2048", "--micro-batch", "8", "--price-per-gpu-hour", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    n = param_count(2048, 20, 8192)
    assert "(6N + 12·L·T·d)·D = 1.46e20 FLOPs" in out and f"{n / 1e9:.3f}B parameters, 20.4B tokens" in out
    shape = memory.Shape(2048, 20, 32, 2048, 8, 8192)
    est = budget.estimate(n_params=n, gpus=8, peak_flops=989e12, mfu=0.4, tokens=20 * n, memory_gb=80, shape=shape,
                          price_per_gpu_hour=2, grad_accum=8)  # "8 GPUs × 8 micro-batches": the gradients exist
    assert "step        8 GPUs × 8 micro-batches" in out
    assert f"{est['hours']:,.2f} hours" in out and f"cost        {est['cost']:,.0f}" in out
    ddp = next(line for line in out.splitlines() if line.strip().startswith("DDP"))
    m = est["memory"]["ddp"]
    assert ddp.split()[1:5] == [f"{x / 1e9:.2f}" for x in (m["state"], m["activations"], m["logits"], m["total"])]
    assert m["state"] == 16 * n and "yes" in ddp and "verdict     fits under DDP" in out  # gradients as bucket views


@pytest.mark.parametrize("params, shape", [
    ("70e9", ["--d-model", "8192", "--n-layer", "80", "--gpus", "64"]),  # the shape is 64.45B
    ("30M", ["--d-model", "512", "--n-layer", "8", "--gpus", "8"]),  # 29.1M: 3 % apart
])
def test_params_that_disagree_with_the_shape_are_said_and_every_row_uses_the_shape(params, shape):
    """DDP's, ZeRO-1's and FSDP's rows, the bytes sent, the FLOPs and the tokens all come from one count:
    the shape's, which train_gpu.py builds; one line says that --params was not used."""
    given, alone = budget.plan(["--params", params, *shape]), budget.plan(shape)
    n = param_count(int(shape[1]), int(shape[3]), 8192)
    assert given["est"]["n_params"] == alone["est"]["n_params"] == n
    assert given["est"] == {**alone["est"], "params_given": budget.plan(["--params", params])["est"]["n_params"]}
    said = [x for x in given["text"].splitlines() if x.startswith("params ")]
    assert len(said) == 1 and f"shape's {n:,}" in said[0] and "is not this shape's count" in said[0], said
    assert [x for x in given["text"].splitlines() if not x.startswith(("params ", "note "))] == [
        x for x in alone["text"].splitlines() if not x.startswith("note ")]
    for scheme, m in given["est"]["memory"].items():  # each row, recomputed from the shape's count
        assert m["total"] == budget.peak_parts(given["shape"], n, int(shape[-1]), scheme,
                                               grad_accum=given["est"]["step"]["grad_accum"],
                                               sync_every=m["sync_every"])["total"]
    agreeing = budget.plan(["--params", str(n), *shape])["text"].splitlines()
    assert not any(x.startswith("params ") for x in agreeing)  # nothing to say


def test_seven_b_on_eight_gpus_needs_sharding():
    shape = memory.Shape(4096, 32, 32, 4096, 2, 50257)
    est = budget.estimate(n_params=7e9, gpus=8, peak_flops=989e12, mfu=0.4, tokens=140e9, memory_gb=80, shape=shape,
                          checkpoint=True)
    fits = {s: m["fits"] for s, m in est["memory"].items()}
    assert fits == {"ddp": False, "zero1": False, "zero2": True, "zero3": True}
    assert "fits under ZeRO-2, ZeRO-3/FSDP (not under DDP, ZeRO-1) at this micro-batch" in budget.report(
        est, "H100", 989e12, 0.4, 80, checkpoint=True)


def test_max_micro_batch_is_the_largest_that_fits():
    shape = memory.Shape(768, 12, 12, 1024, 1, 50257)
    n = param_count(768, 12, 50257)
    for scheme in ("ddp", "zero3"):
        b = budget.max_micro_batch(shape, n, 1, scheme, 80)
        total = [budget.peak_parts(memory.Shape(768, 12, 12, 1024, k, 50257), n, 1, scheme)["total"]
                 for k in (b, b + 1)]
        assert total[0] <= 0.9 * 80e9 < total[1]


def test_layouts_and_checkpointing_change_the_answer():
    base = ["--d-model", "768", "--n-layer", "12", "--vocab-size", "50257", "--gpus", "8", "--seq-len", "1024",
            "--micro-batch", "16"]
    outs = {name: cli(*base, *extra).stdout for name, extra in
            [("autocast", []), ("mixed", ["--layout", "mixed"]), ("ck", ["--checkpoint-activations"])]}
    zero1 = {k: next(line for line in v.splitlines() if "ZeRO-1" in line) for k, v in outs.items()}
    assert zero1["autocast"] != zero1["mixed"]  # same 16 bytes, split differently
    assert "checkpointed per block" in outs["ck"]


@pytest.mark.parametrize("args,message", [
    (["--params", "-1e9"], "negative"),
    (["--params", "0"], "must be positive"),
    (["--params", "lots"], "is not a number"),
    (["--params", "1e9", "--mfu", "1.2"], "is over 1"),
    (["--params", "1e9", "--gpus", "2.5"], "whole number"),
    (["--params", "1e9", "--gpu", "P100"], "unknown GPU 'P100'; known: B200"),
    (["--gpus", "8"], "give the model size"),
    (["--params", "1e9", "--layout", "fp8"], "invalid choice: 'fp8'"),
    (["--params", "1e9", "--fp32-grads"], "goes with --layout mixed"),
    (["--params", "1e9", "--checkpoint-activations"], "need the shape"),
    (["--d-model", "768", "--n-layer", "0"], "must be positive"),
    (["--d-model", "768", "--n-layer", "12", "--n-head", "5"], "must split into 5 heads"),
    (["--d-model", "768"], "give the model size"),
    (["--params", "1e9", "--d-model", "768"], "together"),
    (["--model", "124M", "--d-model", "768"], "--model 124M is a shape already"),
    (["--model", "124M", "--n-head", "6"], "--model 124M is a shape already"),
    (["--model", "125M"], "invalid choice: '125M'"),
    (["--model", "124M", "--grad-accum", "2", "--global-batch-tokens", "1M"], "not allowed with argument"),
])
def test_bad_input_is_one_sentence(args, message):
    with pytest.raises(SystemExit) as e:
        budget.main(args)
    assert e.value.code == 2
    r = cli(*args)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1 and r.stdout == ""
    if args == ["--params", "-1e9"]:  # and so does the script, once
        assert (script(*args).stderr, script(*args).returncode) == (r.stderr, 2)


# ---- communication per step -------------------------------------------------------------------------

def test_ring_collectives_send_what_the_ring_model_says():
    n, g = 1e9, 8
    share = (g - 1) / g
    assert budget.comm_bytes_per_step(n, 1, "ddp") == 0  # one GPU talks to no one
    assert budget.comm_bytes_per_step(n, g, "ddp") == pytest.approx(2 * share * 4 * n)  # fp32 gradients
    assert budget.comm_bytes_per_step(n, g, "ddp", "mixed") == pytest.approx(2 * share * 2 * n)  # bf16 gradients
    # the textbook (ZeRO-1, and ZeRO-2 with one micro-batch): reduce-scatter + all-gather = one all-reduce
    assert budget.comm_bytes_per_step(n, g, "zero1") == pytest.approx(budget.comm_bytes_per_step(n, g, "ddp"))
    assert memory.textbook_sent_bytes(n, g, "zero2") == pytest.approx(budget.comm_bytes_per_step(n, g, "ddp"))
    assert memory.textbook_sent_bytes(n, g, "zero3") == pytest.approx(1.5 * budget.comm_bytes_per_step(n, g, "ddp"))
    # train_gpu.py's FSDP: bf16 all-gathers (ZeRO-3 two per micro-batch, ZeRO-2 one), fp32 reduce-scatter once
    assert budget.comm_bytes_per_step(n, g, "zero3") == pytest.approx(share * (2 * 2 * n + 4 * n))
    assert budget.comm_bytes_per_step(n, g, "zero3") == pytest.approx(budget.comm_bytes_per_step(n, g, "ddp"))
    assert budget.comm_bytes_per_step(n, g, "zero2") == pytest.approx(share * (2 * n + 4 * n))
    # accumulation: DDP once per step; FSDP gathers every micro-batch, reduce-scatters once or every time
    assert budget.comm_bytes_per_step(n, g, "ddp", grad_accum=4) == budget.comm_bytes_per_step(n, g, "ddp")
    assert budget.comm_bytes_per_step(n, g, "zero2", grad_accum=4) == pytest.approx(share * (4 * 2 * n + 4 * n))
    assert budget.comm_bytes_per_step(n, g, "zero3", grad_accum=4) == pytest.approx(share * (4 * 4 * n + 4 * n))
    assert budget.comm_bytes_per_step(n, g, "zero3", grad_accum=4, sync_every=True) == pytest.approx(
        share * 4 * (4 * n + 4 * n))


def test_the_seven_b_plan_holds_and_sends_what_the_description_says():
    """The issue's worked example: 7B shape on 64 H100s, micro-batch 1, 8 micro-batches, checkpointing."""
    argv = ["--d-model", "4096", "--n-layer", "32", "--vocab-size", "50257", "--seq-len", "4096", "--gpus", "64",
            "--micro-batch", "1", "--grad-accum", "8", "--checkpoint-activations"]
    est = budget.plan(argv)["est"]
    n = est["n_params"]
    shape = memory.Shape(4096, 32, 64, 4096, 1, 50257)
    for scheme in ("zero2", "zero3"):
        run = memory.Run(shape, gpus=64, scheme=scheme, precision="bf16", accum=8, checkpoint=True)
        m = est["memory"][scheme]
        assert not m["sync_every"]  # holding the whole fp32 gradients fits: auto holds them
        assert m["total"] == memory.run_peak_bytes(run, n)["total"]
        assert m["comm_bytes"] == sum(memory.run_sent_bytes(run).values())
        assert m["parts"]["whole grads"] == 4 * n
    root = memory.unit_numels(run)["root"]["whole"]  # the tied embedding/head and the final norm
    block = memory.unit_numels(run)["block"]["whole"]
    # ZeRO-3's peak here is the backward of a block (shapes.backward_block_bytes): the root, which FSDP2 keeps
    # for backward, and that block gathered
    assert m["parts"]["gathered weights"] == 2 * (root + block) and m["parts"]["reduce-scatter input"] > 0
    assert est["memory"]["zero2"]["parts"]["gathered weights"] == 2 * n  # all bf16, root too
    held = budget.plan([*argv, "--memory-gb", "40"])["est"]["memory"]
    assert held["zero2"]["sync_every"] and not held["zero3"]["sync_every"]  # auto: ZeRO-2's whole gradients
    assert held["zero2"]["comm_bytes"] > est["memory"]["zero2"]["comm_bytes"]  # do not fit 40 GB: sent more


def test_a_ring_that_leaves_the_machine_runs_at_the_network_port():
    assert budget.link_bytes_per_s(8, 450) == 450e9
    assert budget.link_bytes_per_s(16, 450) == 400e9 / 8  # 400 Gb/s InfiniBand is slower than NVLink
    assert budget.link_bytes_per_s(16, 450, gpus_per_node=16) == 450e9
    assert budget.link_bytes_per_s(16, 16, node_link_gbit=400) == 16e9  # PCIe 3 is slower than the port
    assert budget.link_bytes_per_s(8, None) is None


def test_steps_times_compute_per_step_is_the_training_time():
    shape = memory.Shape(2048, 24, 16, 2048, 8, 50257)
    n = param_count(2048, 24, 50257)
    est = budget.estimate(n_params=n, gpus=8, peak_flops=989e12, mfu=0.4, tokens=20 * n, shape=shape,
                          grad_accum=4, link_bytes_s=450e9)
    st = est["step"]
    assert st["tokens"] == 8 * 4 * 8 * 2048
    assert st["steps"] * st["compute_s"] / 3600 == pytest.approx(est["hours"])
    ddp = est["memory"]["ddp"]
    assert ddp["comm_s"] == pytest.approx(ddp["comm_bytes"] / 450e9)
    assert ddp["comm_dominates"] is False  # 1.3B over NVLink with 4 accumulated micro-batches


def test_the_cli_says_when_communication_dominates():
    slow = cli("--d-model", "768", "--n-layer", "12", "--gpus", "16", "--gpu", "RTX4090", "--seq-len", "256",
               "--micro-batch", "1", "--grad-accum", "1", "--node-link-gbit", "25")
    assert slow.returncode == 0, slow.stderr
    assert "communication takes longer than compute under DDP, ZeRO-1, ZeRO-2, ZeRO-3/FSDP, HSDP" in slow.stdout
    assert "--shard hsdp" in slow.stdout  # across two machines, the fastest: only its all-reduce crosses
    assert "25 Gb/s network port between machines, slower than PCIe 4.0 x16" in slow.stdout
    fast = cli("--d-model", "2048", "--n-layer", "24", "--gpus", "8", "--gpu", "H100", "--grad-accum", "4")
    assert "communication is shorter than backward (about 2/3 of compute) under every scheme" in fast.stdout
    partly = cli("--d-model", "768", "--n-layer", "12", "--gpus", "16", "--gpu", "RTX4090", "--seq-len", "256",
                 "--micro-batch", "1", "--grad-accum", "30", "--node-link-gbit", "100")  # DDP: 0.83 of compute
    assert ("communication takes longer than compute under ZeRO-2, ZeRO-3/FSDP, HSDP: it cannot hide behind backward; "
            "raise --grad-accum or --micro-batch, or use a faster link; communication is shorter than compute but "
            "longer than backward (about 2/3 of compute) under DDP, ZeRO-1: part of it shows") in partly.stdout
    one = cli("--params", "1e9", "--gpus", "1")
    assert "comm        none: one GPU" in one.stdout
    custom = cli("--params", "1e9", "--peak-tflops", "100", "--memory-gb", "40")
    assert "link unknown: give --link-gb-s" in custom.stdout


def test_the_threshold_is_where_the_plans_communication_meets_its_compute():
    # chapter 8: budget.py's comm/compute under DDP is T*/T_dev, with the plan's own c and β
    e = budget.plan("--d-model 768 --n-layer 12 --seq-len 1024 --vocab-size 50257 --gpus 8 --gpu RTX4090 "
                    "--micro-batch 2 --grad-accum 3".split())["est"]
    c = e["flops"] / (e["tokens"] * e["n_params"])
    beta = budget.sent_per_param("ddp", 8, 3)
    assert beta == 2 * 7 / 8 * 4  # one fp32 all-reduce a step, whatever the accumulation
    t_star = budget.comm_threshold(beta, gpus.GPUS["rtx4090"].peak_flops * budget.DEFAULT_MFU,
                                   e["step"]["link_bytes_s"], c)
    ratio = e["memory"]["ddp"]["comm_s"] / e["step"]["compute_s"]
    assert math.isclose(ratio, t_star / (2 * 1024 * 3), rel_tol=1e-9)
    assert budget.sent_per_param("zero3", 8, textbook=True) == 1.5 * budget.sent_per_param("ddp", 8)


def test_the_peak_by_kind_adds_up():
    peak = memory.step_bytes(memory.Shape(512, 8, 8, 512, 32, 8192), param_count(512, 8, 8192))
    kinds = memory.by_kind(peak)
    assert sum(kinds.values()) == peak["total"] and min(kinds.values()) > 0


def test_page_gives_the_cli_text_or_its_error_and_the_figures_numbers():
    argv = ["--d-model", "768", "--n-layer", "12", "--gpus", "8", "--price-per-gpu-hour", "2"]
    out = budget.page(argv)
    assert out["ok"] and out["text"] == cli(*argv).stdout.rstrip("\n")
    assert set(out["memory"]) == {memory.SCHEME_NAMES[s] for s in budget.plan(argv)["est"]["memory"]}
    ddp = out["memory"]["DDP"]
    est = budget.plan(argv)["est"]
    assert sum(ddp.values()) == pytest.approx(est["memory"]["ddp"]["total"] / 1e9)
    i = out["sweep"]["gpus"].index(8)
    assert out["sweep"]["hours"][i] == pytest.approx(est["hours"])
    assert out["sweep"]["cost"][i] == pytest.approx(est["cost"])
    assert out["sweep"]["hours_with_comm"]["DDP"][i] > est["hours"]
    bad = budget.page(["--params", "1e9", "--mfu", "2"])
    assert not bad["ok"] and bad["text"] == ""
    assert bad["error"] == cli("--params", "1e9", "--mfu", "2").stderr.strip()


@pytest.mark.parametrize("args", [("--params", "1e300", "--tokens", "1e300"), ("--params", "1e9", "--gpus", "1e300")])
def test_numbers_beyond_a_float_are_one_sentence(args):
    r = cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("budget.py: error: these numbers are beyond what a float can hold (a result overflows); "
                        "use realistic sizes (see --help)\n")


def test_page_shows_the_model_state_when_only_the_size_is_given():
    out = budget.page(["--params", "1e9", "--gpus", "8", "--grad-accum", "1"])
    assert out["memory"]["DDP"] == pytest.approx({"weights": 4.0, "grads": 4.0, "optimizer": 8.0, "buckets": 0.0,
                                                  "whole grads": 0.0, "gathered weights": 0.0})
    assert sum(out["memory"]["ZeRO-3/FSDP"].values()) == pytest.approx(16 / 8)
    # by default the step accumulates to GPT-3's 1M tokens: FSDP holds the whole fp32 gradients meanwhile
    accumulating = budget.page(["--params", "1e9", "--gpus", "8"])["memory"]["ZeRO-3/FSDP"]
    assert accumulating["whole grads"] == pytest.approx(4.0)


def _command(*args):
    """The command line a plan prints, without its last flags (--out OUT --auto-resume across machines,
    --out out_gpu --auto-resume on one: test_the_printed_command_is_launched_as_launch_does), and the text."""
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("command "))
    return line.removesuffix(" --auto-resume").rsplit(" --out ", 1)[0].removesuffix(" --data DATA"), r.stdout


def test_the_plan_prints_the_train_gpu_command_of_the_scheme_that_fits():
    line, _ = _command("--d-model", "768", "--n-layer", "12", "--gpus", "8", "--seq-len", "1024",
                       "--micro-batch", "8", "--grad-accum", "4")
    assert line.split(None, 1)[1] == (
        "torchrun --standalone --nproc-per-node=8 --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 "
        "--shutdown-timeout=170 code/train_gpu.py --d-model 768 --n-layer 12 --n-head 12 --vocab-size 50257 "
        "--seq-len 1024 --micro-batch 8 --global-batch-tokens 262144 --steps 9427 --shard ddp")
    line, _ = _command("--d-model", "5120", "--n-layer", "40", "--gpus", "64", "--seq-len", "4096",
                       "--micro-batch", "1", "--gpu", "RTX4090", "--checkpoint-activations", "--grad-accum", "1")
    assert "--nnodes=8 --nproc-per-node=8" in line and line.endswith("--shard fsdp --checkpoint-activations")
    # by default 8 micro-batches make GPT-3's 2M tokens: the whole fp32 gradients do not fit 24 GB, so every
    line, _ = _command("--d-model", "5120", "--n-layer", "40", "--gpus", "64", "--seq-len", "4096",
                       "--micro-batch", "1", "--gpu", "RTX4090", "--checkpoint-activations")
    assert "--global-batch-tokens 2097152" in line and line.endswith("--shard fsdp --checkpoint-activations "
                                                                     "--grad-sync every")
    line, _ = _command("--d-model", "5120", "--n-layer", "40", "--gpus", "64", "--seq-len", "4096",
                       "--micro-batch", "1", "--gpu", "A100-40GB", "--checkpoint-activations", "--grad-accum", "1")
    # ZeRO-2 fits too (its gathered weights are bf16), but across 8 machines HSDP is the fastest that fits: its
    # gathers stay inside each machine
    assert line.endswith("--shard hsdp --checkpoint-activations")
    line, text = _command("--d-model", "4096", "--n-layer", "32", "--gpus", "64", "--seq-len", "4096",
                          "--micro-batch", "2", "--gpu", "A100-40GB")
    assert "verdict     fits under no scheme" in text and "--micro-batch 1 " in line  # the one that fits
    line, _ = _command("--d-model", "4096", "--n-layer", "32", "--gpus", "6", "--gpus-per-node", "4",
                       "--seq-len", "4096", "--micro-batch", "1", "--checkpoint-activations")
    assert line.startswith("command     none: 6 GPUs do not split evenly") or "--checkpoint-activations" in line


def test_zero1_is_named_with_the_closest_flag_and_its_cost():
    line, text = _command("--d-model", "4096", "--n-layer", "32", "--gpus", "64", "--seq-len", "4096",
                          "--micro-batch", "2", "--checkpoint-activations", "--grad-accum", "4")
    assert "verdict     fits under ZeRO-1" in text
    note = next(x for x in text.splitlines() if x.startswith("note "))
    assert "no ZeRO-1; the closest is --shard fsdp --no-reshard-after-forward" in note
    est = budget.plan(["--d-model", "4096", "--n-layer", "32", "--gpus", "64", "--seq-len", "4096", "--micro-batch",
                       "2", "--checkpoint-activations", "--grad-accum", "4"])["est"]["memory"]
    assert f"sends {(est['zero2']['comm_bytes'] - est['zero1']['comm_bytes']) / 1e9:.2f} GB more" in note
    assert line.endswith("--shard hsdp --checkpoint-activations --grad-sync last")  # the fastest that fits
    assert "note        HSDP: the fastest scheme that fits" in text


@pytest.mark.slow  # starts torchrun: not on the fast path (tests/conftest.py)
def test_the_printed_command_runs_scaled_down_on_two_cpu_processes(tmp_path):
    """The 7B plan's command, with the shape and the step scaled down to a tiny CPU run: every flag the
    budget prints is one train_gpu.py takes, and the scheme it names is the one that runs."""
    import os
    import shlex
    import signal
    line, _ = _command("--d-model", "4096", "--n-layer", "32", "--gpus", "64", "--seq-len", "4096",
                       "--micro-batch", "2", "--checkpoint-activations")
    argv = shlex.split(line.split(None, 1)[1])
    script = argv.index("code/train_gpu.py")
    flags = argv[script + 1:]
    tiny = {"--d-model": "32", "--n-layer": "2", "--n-head": "2", "--vocab-size": "8192", "--seq-len": "32",
            "--micro-batch": "2", "--global-batch-tokens": "256", "--steps": "2"}
    for k, v in tiny.items():
        flags[flags.index(k) + 1] = v
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(REPO / "code" / "train_gpu.py"), *flags, "--device", "cpu", "--out", str(tmp_path / "run"),
           "--sample-tokens", "0", "--log-every", "1", "--timeout-s", "60"]
    print(shlex.join(cmd[2:]))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    print(out)
    assert p.returncode == 0, out + err
    assert flags[flags.index("--shard") + 1] == "hsdp"  # across 8 machines, the fastest scheme that fits
    assert "HSDP over 2 processes" in out and "recompute: on" in out
    assert "memory ledger (code/shapes.py) for this run on a GPU" in out and "step     2/2" in out


@pytest.mark.parametrize("flags, name, state_bytes", [
    ([], "autocast over fp32 weights", 16),
    (["--layout", "mixed"], "bf16 weights and gradients + fp32 master (the ZeRO paper's 16 bytes)", 16),
    (["--layout", "mixed", "--fp32-grads"], "fp32 gradients + fp32 master (Megatron-LM's default, 18 bytes)", 18),
])
def test_the_report_names_the_layout_it_counted(flags, name, state_bytes):
    argv = ["--d-model", "768", "--n-layer", "12", "--gpus", "1", *flags]
    label = budget.page(argv)["text"].split("memory per GPU (GB): ")[1].split(";")[0]
    assert name in label
    est = budget.plan(argv)["est"]
    assert est["memory"]["ddp"]["state"] == state_bytes * est["n_params"]  # the bytes the name states


# ---- the vocabulary follows the model ------------------------------------------------------------------

def _vocab_line(text):
    return next(x for x in text.splitlines() if x.startswith("vocabulary "))


@pytest.mark.parametrize("argv, vocab, why", [
    (["--model", "124M"], 50257, "GPT-2's tokenizer, as GPT-2 124M has (--model 124M"),
    (["--d-model", "768", "--n-layer", "12"], 50257, "d 768, L 12 is GPT-2 124M's shape"),  # the seed's nanoGPT
    (["--d-model", "768", "--n-layer", "12", "--vocab-size", "8192"], 8192, "8,192: --vocab-size"),
    (["--model", "7B", "--vocab-size", "32000"], 32000, "32,000: --vocab-size"),
    (["--d-model", "2048", "--n-layer", "20"], 8192, "the book's tokenizer, train_gpu.py's default"),
    (["--model", "book-1.8M"], 8192, "the book's tokenizer, as the book's default model has"),
    (["--d-model", "512", "--n-layer", "8"], 8192, "is train_gpu.py's default model's shape"),
])
def test_the_vocabulary_follows_the_named_model_and_the_text_says_which(argv, vocab, why):
    p = budget.plan([*argv, "--gpus", "1", "--memory-gb", "1e4"])  # room for any of them: a command
    assert p["shape"].vocab_size == p["est"]["vocab_size"] == vocab
    assert p["est"]["n_params"] == param_count(p["shape"].d_model, p["shape"].n_layer, vocab)
    line = _vocab_line(p["text"])
    assert line.startswith(f"vocabulary  {vocab:,}: ") and why in line
    assert f"--vocab-size {vocab} " in p["text"].splitlines()[-1]  # the command trains with it


def test_named_models_are_what_they_name():
    from train_gpu import build_parser as train_gpu_parser
    gpt2 = {"124M": (12, 768), "350M": (24, 1024), "774M": (36, 1280), "1.5B": (48, 1600)}  # Radford et al. Table 2
    for name, (layers, width) in gpt2.items():
        m = budget.MODELS[name]
        assert (m.n_layer, m.d_model, m.vocab_size, m.seq_len) == (layers, width, 50257, 1024)
        assert m.d_model // m.n_head == 64
    for sc in budget.REFERENCE:  # the reference table's shapes, on its vocabulary
        m = budget.MODELS[sc.label.split()[0]]
        assert (m.d_model, m.n_layer, m.n_head, m.seq_len, m.vocab_size) == (
            sc.d_model, sc.n_layer, sc.n_head, sc.seq_len, budget.REFERENCE_VOCAB)
    book, cfg = budget.MODELS["book-1.8M"], GPTConfig()
    assert (book.d_model, book.n_layer, book.n_head, book.seq_len, book.vocab_size) == (
        cfg.d_model, cfg.n_layer, cfg.n_head, cfg.seq_len, cfg.vocab_size)
    assert budget.plan(["--model", "book-1.8M"])["est"]["n_params"] == GPT(cfg).num_params()
    d, m = train_gpu_parser().parse_args([]), budget.MODELS["book-29M"]
    assert (m.d_model, m.n_layer, m.n_head, m.seq_len, m.vocab_size) == (
        d.d_model, d.n_layer, d.n_head, d.seq_len, d.vocab_size)
    # a named model sets the default sequence length; --seq-len still wins
    assert budget.plan(["--model", "124M"])["shape"].seq_len == 1024
    assert budget.plan(["--model", "124M", "--seq-len", "2048"])["shape"].seq_len == 2048
    assert budget.plan(["--d-model", "768", "--n-layer", "12"])["shape"].seq_len == 2048
    assert "vocabulary" not in budget.plan(["--params", "124M"])["text"]  # no shape, no logits to count
    help_text = budget.build_parser().format_help()
    assert "--model" in help_text and "768 × 12 is GPT-2" in help_text


# ---- the global batch and its accumulation --------------------------------------------------------------

def test_the_default_global_batch_is_gpt3s_for_the_nearest_size():
    want = {123.6e6: 2**19, 350e6: 2**19, 1.02e9: 2**20, 1.3e9: 2**20, 6.644e9: 2**21, 13e9: 2**21,
            40e9: 2**21, 70e9: 12 * 2**18, 175e9: 12 * 2**18}  # by ratio: 40B is nearer 13B, 70B nearer 175B
    for n, tokens in want.items():
        assert budget.reference_batch_tokens(n)[0] == tokens, n
    assert budget.reference_batch_tokens(124e6) == (524288, 125e6)


def _step(argv):
    p = budget.plan(argv)
    return p, p["est"]["step"], next(x for x in p["text"].splitlines() if x.startswith("batch "))


def test_the_plan_accumulates_to_the_global_batch():
    # the seed's nanoGPT run: 8 × 1024 tokens a micro-batch, 64 of them, 524,288 tokens a step
    p, st, line = _step(["--model", "124M", "--gpus", "1", "--gpu", "RTX3060", "--micro-batch", "8",
                         "--checkpoint-activations"])
    assert (st["grad_accum"], st["tokens"]) == (64, 524288)
    assert "524,288 tokens per step: GPT-3's 0.5M tokens for its 125M model" in line and "Table 2.1" in line
    assert "--global-batch-tokens 524288 --steps" in p["text"].splitlines()[-1]
    assert st["steps"] == pytest.approx(p["est"]["tokens"] / 524288)
    # micro-batch 7: the whole number of micro-batches nearest 524,288
    _, st, line = _step(["--model", "124M", "--gpus", "1", "--gpu", "RTX3060", "--micro-batch", "7"])
    assert (st["grad_accum"], st["tokens"]) == (73, 73 * 7 * 1024)
    assert "the whole number of micro-batches nearest 524,288" in line
    # more GPUs, fewer micro-batches each; a bigger model, a bigger batch
    _, st, _ = _step(["--model", "124M", "--gpus", "8", "--micro-batch", "16"])
    assert (st["grad_accum"], st["tokens"]) == (4, 524288)
    _, st, _ = _step(["--model", "7B", "--gpus", "64", "--micro-batch", "1", "--checkpoint-activations"])
    assert (st["grad_accum"], st["tokens"]) == (8, 2**21)
    # asked for: --global-batch-tokens (rounded to whole micro-batches), --grad-accum (as given)
    _, st, line = _step(["--model", "124M", "--gpus", "1", "--micro-batch", "8", "--global-batch-tokens", "1M"])
    assert (st["grad_accum"], st["tokens"]) == (122, 122 * 8192) and "--global-batch-tokens 1,000,000" in line
    _, st, line = _step(["--model", "124M", "--gpus", "1", "--micro-batch", "8", "--grad-accum", "3"])
    assert (st["grad_accum"], st["tokens"]) == (3, 3 * 8192) and "(--grad-accum 3)" in line
    # one micro-batch on every GPU is already more than the batch asked for: said, not hidden
    _, st, line = _step(["--model", "124M", "--gpus", "512", "--micro-batch", "8"])
    assert st["grad_accum"] == 1 and "one micro-batch on every GPU, more than the 524,288 asked" in line


def printed_plan(p: dict) -> dict:
    """The plan whose command p prints: p itself, or the one its note names (another micro-batch)."""
    import shlex
    note = next((x for x in p["text"].splitlines() if x.endswith(" prints the command's rows")), None)
    if note is None:
        return p
    argv = note.split("python code/budget.py ", 1)[1].removesuffix(" prints the command's rows")
    return budget.plan(shlex.split(argv))


@pytest.mark.parametrize("plan", [
    ["--model", "124M", "--gpus", "1", "--gpu", "RTX3060", "--micro-batch", "7"],
    ["--model", "124M", "--gpus", "1", "--gpu", "RTX3060", "--micro-batch", "8", "--checkpoint-activations"],
    ["--model", "1.3B", "--gpus", "8", "--micro-batch", "4"],
    ["--d-model", "2048", "--n-layer", "20", "--gpus", "8", "--seq-len", "2048", "--micro-batch", "8"],
    ["--model", "7B", "--gpus", "64", "--micro-batch", "1", "--checkpoint-activations"],
    ["--model", "7B", "--gpus", "64", "--micro-batch", "2"],
    ["--model", "7B", "--gpus", "64", "--micro-batch", "1", "--checkpoint-activations", "--memory-gb", "40"],
    ["--model", "7B", "--gpus", "64", "--micro-batch", "1", "--grad-accum", "8", "--checkpoint-activations"],
])
def test_the_printed_command_is_the_plan_train_gpu_runs(plan, monkeypatch):
    """The command budget.py prints, parsed by train_gpu.py's own parser: the same global batch, the
    accumulation train_gpu.py derives from it, and the run it plans holds and sends the bytes of the
    budget's row (as tests/test_train_gpu.py checks for its plans)."""
    import shlex

    from memory import run_peak_bytes, run_sent_bytes
    from train_gpu import build_parser, check_args, planned_run
    p = printed_plan(budget.plan(plan))
    line = next(x for x in p["text"].splitlines() if x.startswith("command "))
    argv = shlex.split(line.split(None, 1)[1])
    world, st = p["est"]["gpus"], p["est"]["step"]
    per_node = next(int(a.split("=")[1]) for a in argv if a.startswith("--nproc-per-node="))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))  # as torchrun sets it on each machine
    args = build_parser().parse_args(argv[argv.index("code/train_gpu.py") + 1:])
    accum = check_args(args, world)
    assert (args.global_batch_tokens, accum, args.vocab_size) == (st["tokens"], st["grad_accum"], p["shape"].vocab_size)
    assert st["tokens"] >= 2**18 and args.steps == math.ceil(st["steps"])  # not one sequence per GPU
    run = planned_run(args, world, accum, "bf16")
    row = p["est"]["memory"][run.scheme]
    assert run_peak_bytes(run, p["est"]["n_params"])["total"] == row["total"]
    assert sum(run_sent_bytes(run).values()) == row["comm_bytes"]
    assert run.sync_every == row["sync_every"]


# ---- the seed's question: does 124M at micro-batch 8 × 1024 fit a 12 GB card? -----------------------------

SEED_12GB = ["--model", "124M", "--gpus", "1", "--gpu", "RTX3060", "--seq-len", "1024", "--micro-batch", "8"]


def test_the_seed_question_124m_at_8_by_1024_does_not_fit_12_gb():
    p = budget.plan(SEED_12GB)
    ddp, usable = p["est"]["memory"]["ddp"], budget.USABLE_FRACTION * 12 * budget.GB
    assert p["est"]["n_params"] == param_count(768, 12, 50257) and p["memory_gb"] == 12
    assert round(ddp["total"] / 1e9, 2) == 11.41 and usable == pytest.approx(10.8e9)
    assert not ddp["fits"] and ddp["max_micro_batch"] == 7
    assert list(p["est"]["memory"]) == ["ddp"]  # one GPU: sharding changes nothing, one row
    assert "fits 10.8 of 12 GB?" in p["text"] and "verdict     does not fit on one GPU: " in p["text"]
    seven = budget.plan([*SEED_12GB[:-1], "7"])["est"]["memory"]["ddp"]
    assert seven["fits"] and seven["total"] <= usable
    ck = budget.plan([*SEED_12GB, "--checkpoint-activations"])
    assert ck["est"]["memory"]["ddp"]["fits"] and round(ck["est"]["memory"]["ddp"]["total"] / 1e9, 2) == 7.36
    assert "verdict     fits on one GPU\n" in ck["text"]
    # the trap the vocabulary rule closes: GPT-2's shape on the book's 8,192 tokens is a 91M model that fits
    small = budget.plan([*SEED_12GB[2:], "--d-model", "768", "--n-layer", "12", "--vocab-size", "8192"])
    assert small["est"]["n_params"] < 0.1e9 and small["est"]["memory"]["ddp"]["fits"]
    same = budget.plan([*SEED_12GB[2:], "--d-model", "768", "--n-layer", "12"])  # the shape alone: GPT-2's
    assert same["est"]["memory"]["ddp"]["total"] == ddp["total"]


# ---- one GPU: one row, since there is nothing to shard --------------------------------------------------

@pytest.mark.parametrize("argv", [
    SEED_12GB,
    [*SEED_12GB, "--checkpoint-activations", "--grad-sync", "every"],
    ["--model", "1.3B", "--gpu", "H100", "--layout", "mixed", "--fp32-grads", "--grad-accum", "1"],
    ["--params", "1e9", "--layout", "mixed"],  # the state alone
])
def test_on_one_gpu_the_ledger_gives_every_scheme_ddps_numbers(argv):
    """Why one GPU shows one row: ZeRO-1/2/3 over one GPU hold what DDP holds and send nothing."""
    args, est = (p := budget.plan([*argv, "--gpus", "1"]))["args"], p["est"]
    accum = est["step"]["grad_accum"]
    for scheme in memory.SCHEMES:
        sync = budget.choose_sync(p["shape"], est["n_params"], 1, scheme, p["memory_gb"], args.layout,
                                  args.checkpoint_activations, accum, args.grad_sync)
        row = budget.peak_parts(p["shape"], est["n_params"], 1, scheme, args.layout, args.fp32_grads,
                                args.checkpoint_activations, accum, sync)
        ddp = budget.peak_parts(p["shape"], est["n_params"], 1, "ddp", args.layout, args.fp32_grads,
                                args.checkpoint_activations, accum)
        assert row["total"] == pytest.approx(ddp["total"], rel=1e-12), scheme
        assert budget._state(row) == pytest.approx(budget._state(ddp), rel=1e-12), scheme
        assert budget.comm_bytes_per_step(est["n_params"], 1, scheme, args.layout, args.fp32_grads, accum,
                                          p["shape"], sync) == 0


def _memory_rows(text):
    """The schemes of the memory table's rows, in order."""
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("  scheme ") and "activations" in x) + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("  "))
    return [x.split()[0] for x in lines[start:end]]


def test_one_gpu_prints_one_row_and_says_why():
    one = cli(*SEED_12GB)
    assert one.returncode == 0, one.stderr
    assert _memory_rows(one.stdout) == ["DDP"]  # not four rows with the same numbers
    assert budget.ONE_GPU_LINE in one.stdout.splitlines()
    assert "ZeRO-1 (not in train_gpu.py)" not in one.stdout and "FSDP's gathered weights" not in one.stdout
    page = budget.page(SEED_12GB)
    assert list(page["memory"]) == ["DDP"] and [b["scheme"] for b in page["memory_figure"]["bars"]] == ["DDP"]
    # the time plot still shows what each scheme costs once there are GPUs to shard over
    sweep = page["sweep"]
    for name in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3/FSDP"):  # from one GPU, where each is compute alone, on
        assert None not in sweep["hours_with_comm"][name] and sweep["hours_with_comm"][name][0] == sweep["hours"][0]
    assert sweep["hours_with_comm"]["ZeRO-3/FSDP"][1] > sweep["hours_with_comm"]["DDP"][1]  # 2 GPUs: they part
    two = cli(*SEED_12GB[:2], "--gpus", "2", *SEED_12GB[4:])
    assert _memory_rows(two.stdout) == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3/FSDP"]
    assert budget.ONE_GPU_LINE not in two.stdout


# ---- the memory figure: no label overlaps a line, a bar or another label ---------------------------------

@pytest.fixture(scope="module")
def measure_text():
    """(width, ascent, descent) in pixels of a label at the figure's font size, by matplotlib's Agg
    renderer with DejaVu Sans (bold for the bars' totals): a real font's extents."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties
    renderer, cache = RendererAgg(100, 100, 72), {}  # 72 dpi: 11 points are 11 pixels

    def measure(text, bold=False):
        if (text, bold) not in cache:
            prop = FontProperties(family="DejaVu Sans", weight="bold" if bold else "normal",
                                  size=budget.FIGURE_FONT_PX)
            w, h, d = renderer.get_text_width_height_descent(text, prop, ismath=False)
            cache[text, bold] = (w, h - d, d)
        return cache[text, bold]
    return measure


def _figure_problems(fig, measure):
    """Every overlap in a laid-out memory figure, measured with a real font; [] when there is none."""
    halo = 1.5  # calculator.css draws labels with a 3-px halo: half of it on each side
    texts = []  # (name, box)
    labels = [(f"total {b['scheme']}", b["label"], True) for b in fig["bars"]]
    labels += [(f"tick {b['scheme']}", b["tick"], False) for b in fig["bars"]]
    labels += [(f"line {r['gb']:g}", r["label"], False) for r in fig["limits"]]
    labels += [(f"legend {e['part']}", e["label"], False) for e in fig["legend"]]
    labels += [(f"y tick {t['label']['text']}", t["label"], False) for t in fig["ticks"]]
    problems = []
    for name, lab, bold in labels:
        w, asc, desc = measure(lab["text"], bold)
        est = budget.label_box(lab)
        if w > est[2] - est[0] or asc > lab["y"] - est[1] or desc > est[3] - lab["y"]:
            problems.append(f"{name}: {lab['text']!r} is larger in DejaVu Sans than the layout's bound")
        x0 = {"start": lab["x"], "middle": lab["x"] - w / 2, "end": lab["x"] - w}[lab["anchor"]]
        box = (x0 - halo, lab["y"] - asc - halo, x0 + w + halo, lab["y"] + desc + halo)
        if name.startswith("legend"):
            box = (lab["x"] - 14, *box[1:])  # its colour swatch, to the left
        texts.append((name, box))
        if box[0] < 0 or box[1] < 0 or box[2] > fig["width"] or box[3] > fig["height"]:
            problems.append(f"{name} leaves the figure: {box}")
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1:]:
            if budget._overlap(box_a, box_b):
                problems.append(f"{a} overlaps {b}")
        for r in fig["limits"]:  # the lines, 1.3 px wide
            if box_a[0] < r["x2"] and r["x1"] < box_a[2] and box_a[1] < r["y"] + 1 and r["y"] - 1 < box_a[3]:
                problems.append(f"{a} is crossed by the line at {r['gb']:g} GB")
        for bar in fig["bars"]:
            for seg in bar["segments"]:
                if budget._overlap(box_a, (bar["x"], seg["y"], bar["x"] + bar["width"], seg["y"] + seg["height"])):
                    problems.append(f"{a} overlaps {bar['scheme']}'s {seg['part']}")
    return problems


@pytest.mark.parametrize("argv", [
    ["--model", "7B", "--gpus", "64", "--micro-batch", "2", "--grad-accum", "1"],  # the reader's 7B plot
    ["--model", "7B", "--gpus", "64", "--micro-batch", "2"],
    SEED_12GB,  # 11.4 GB under "GPU memory 12 GB" in the reader's 124M plot
    [*SEED_12GB, "--checkpoint-activations"],
    ["--d-model", "2048", "--n-layer", "20", "--gpus", "8", "--seq-len", "2048", "--micro-batch", "8"],
    ["--params", "1e9", "--gpus", "8"],  # the state alone
    ["--params", "1e9", "--gpus", "8", "--peak-tflops", "100"],  # no memory size: no lines
])
def test_the_memory_figure_has_no_overlapping_labels(argv, measure_text):
    fig = budget.page(argv)["memory_figure"]
    assert fig["bars"] and not _figure_problems(fig, measure_text)


def test_no_total_hides_under_a_line_wherever_it_falls(measure_text):
    """Totals swept through and around both lines, with and without a tall bar that squeezes them
    together, on a 12 GB and an 80 GB card: the layout keeps every label clear."""
    parts = ("weights", "grads", "optimizer", "layers", "head", "weight copies", "logits", "logit temporaries")
    for memory_gb in (12, 80):
        usable = budget.USABLE_FRACTION * memory_gb
        for tall in (None, 2.3 * memory_gb, 14 * memory_gb):
            for k in range(81):
                total = memory_gb * (0.7 + 0.005 * k)  # 70 % to 110 % of the card, in 0.5 % steps
                bars = {"DDP": total, "ZeRO-1": total * 0.97, "ZeRO-2": usable, "ZeRO-3/FSDP": total * 0.995}
                if tall:
                    bars["DDP"] = tall
                memory = {s: {p: t / len(parts) for p in parts} for s, t in bars.items()}
                fig = budget.memory_figure(memory, memory_gb, usable)
                problems = _figure_problems(fig, measure_text)
                assert not problems, (memory_gb, tall, total, problems)


# ---- the printed command is the one launch/ runs, and there is one where anything fits ---------------------

def command_of(text):
    """The command a plan prints, as its argv."""
    lines = [x for x in text.splitlines() if x.startswith("command ")]
    assert len(lines) == 1, text
    return shlex.split(lines[0].split(None, 1)[1])


def launch_argv(path):
    """torchrun's arguments in a launch/ file (the shell's quotes and variables left as words)."""
    line = next(x.strip() for x in (REPO / path).read_text(encoding="utf-8").splitlines()
                if x.strip().startswith("torchrun "))
    return shlex.split(line.replace('"', ""))[1:]


@pytest.mark.parametrize("plan, nodes", [
    (["--model", "124M", "--gpus", "1", "--gpu", "RTX3060", "--micro-batch", "7"], 1),
    (["--model", "1.3B", "--gpus", "8", "--micro-batch", "4"], 1),
    (["--model", "7B", "--gpus", "64", "--micro-batch", "1", "--checkpoint-activations"], 8),
])
def test_the_printed_command_is_launched_as_launch_does(plan, nodes):
    """Parsed by torchrun's own parser and by train_gpu.py's: the signals forwarded and the time to save
    are launch/slurm.sbatch's and launch/skypilot.yaml's (both from gpus.TORCHRUN_STOP_FLAGS), and the
    script resumes from its --out."""
    from torch.distributed.run import get_args_parser

    from train_gpu import build_parser
    argv = command_of(budget.plan(plan)["text"])
    assert argv[0] == "torchrun"
    ns = get_args_parser().parse_args(argv[1:])
    stop = get_args_parser().parse_args([*gpus.TORCHRUN_STOP_FLAGS, "x.py"])
    for path in ("launch/slurm.sbatch", "launch/skypilot.yaml"):
        launch = get_args_parser().parse_args(launch_argv(path))
        assert (ns.signals_to_handle, ns.shutdown_timeout) == (launch.signals_to_handle, launch.shutdown_timeout) \
            == (stop.signals_to_handle, stop.shutdown_timeout), path
    assert "SIGUSR1" in ns.signals_to_handle.split(",") and ns.shutdown_timeout == gpus.SHUTDOWN_TIMEOUT_S
    assert ns.training_script == "code/train_gpu.py" and ns.nnodes == ("1:1" if nodes == 1 else str(nodes))
    args = build_parser().parse_args(ns.training_script_args)
    assert args.auto_resume and args.out == ("out_gpu" if nodes == 1 else "OUT")  # OUT: a folder every node sees


def test_when_nothing_fits_the_command_is_the_nearest_plan_that_does():
    # the seed's question: micro-batch 8 does not fit 12 GB; the largest that does is printed, with its plan
    p = budget.plan(SEED_12GB)
    assert not any(m["fits"] for m in p["est"]["memory"].values())
    best = p["est"]["memory"]["ddp"]["max_micro_batch"]
    fitting = budget.plan([*SEED_12GB[:-1], str(best)])
    assert command_of(p["text"]) == command_of(fitting["text"]) and best == 7
    notes = [x for x in p["text"].splitlines() if x.startswith("note ")]
    assert "nothing fits at micro-batch 8 without checkpointing; the plans that fit" in notes[0]
    assert f"note        python code/budget.py {' '.join(SEED_12GB[:-1])} 7 prints the command's rows" in notes
    rows = p["text"].split(notes[0])[1].splitlines()[2:]  # below the table's header
    assert rows[0].split()[:2] == ["7", "DDP"] and rows[0].endswith("<- the command")  # one GPU: DDP's rows
    assert [int(r.split()[0]) for r in rows if r.startswith("  ")] == [7, 4, 2, 1]  # each fits; faster first
    # 64.5B on 64 H100s: not one sequence fits without checkpointing, so the command recomputes
    shape = ["--d-model", "8192", "--n-layer", "80", "--gpus", "64"]
    p = budget.plan(shape)
    assert max(m["max_micro_batch"] for m in p["est"]["memory"].values()) == 0
    ck = budget.plan([*shape, "--checkpoint-activations"])
    assert command_of(p["text"]) == command_of(ck["text"]) and "--checkpoint-activations" in command_of(p["text"])
    # nothing at all: said
    none = budget.plan(["--model", "7B", "--gpus", "8", "--gpu", "RTX3060", "--seq-len", "8192"])["text"]
    assert none.splitlines()[-1].startswith("command     none: not even one sequence per GPU fits under any scheme")


def test_recomputation_adds_each_blocks_forward_to_the_hours():
    """--checkpoint-activations redoes every block's forward in backward: 2 FLOPs per block weight and
    attention's forward, a third of a step's FLOPs less the tied head's share; the hours count them."""
    base = ["--model", "7B", "--gpus", "64", "--micro-batch", "1", "--grad-accum", "8"]
    plain, redone = budget.plan(base)["est"], budget.plan([*base, "--checkpoint-activations"])["est"]
    share = redone["step"]["recompute_share"]
    assert 0.30 < share < 1 / 3 and plain["step"]["recompute_share"] == 0  # the head is not recomputed
    assert redone["hours"] == pytest.approx(plain["hours"] * (1 + share))
    assert redone["flops"] == plain["flops"]  # the model's FLOPs, as MFU counts them
    assert f"recomputation included: each block's forward again, {share:.1%} more FLOPs" in budget.plan(
        [*base, "--checkpoint-activations"])["text"]


# ---- the printed plan: the fastest (micro-batch, scheme) pair, and its own verdict (C5, P18) -------------

def test_seven_b_on_64_h100s_prints_the_fastest_pair_and_its_own_verdict():
    """At its own micro-batch 2 only ZeRO-3 fits, and its rows say communication is 1.08x compute; at
    micro-batch 1 HSDP fits and communicates 0.15x. The command is HSDP at 1, and the verdict printed
    beside it is the command's own, with the fit within 1 % of the limit flagged."""
    text = budget.plan(["--model", "7B", "--gpus", "64", "--gpu", "H100"])["text"]
    lines = text.splitlines()
    assert "× 2 sequences ×" in next(x for x in lines if x.startswith("step "))  # the 7B's own micro-batch
    assert "verdict     fits under ZeRO-3/FSDP (not under DDP, ZeRO-1, ZeRO-2, HSDP) at this micro-batch" in lines
    command = lines[-1]
    assert "--micro-batch 1 " in command and "--shard hsdp " in command
    verdict = lines[-2]
    hsdp_1 = budget.plan(["--model", "7B", "--gpus", "64", "--gpu", "H100", "--micro-batch", "1"])["est"]
    total = hsdp_1["memory"]["hsdp"]["total"]
    assert verdict.startswith(f"verdict     the command below: HSDP at micro-batch 1; {total / 1e9:.2f} of 72 GB")
    assert "communication 0.15 of compute, shorter than backward" in verdict
    # a fit within 1 % of the usable memory is flagged: the same plan on a GPU just large enough
    snug = total / budget.GB / budget.USABLE_FRACTION / 0.995
    tight = budget.plan(["--model", "7B", "--gpus", "64", "--gpu", "H100", "--micro-batch", "1", "--memory-gb",
                         f"{snug:.4f}"])["text"].splitlines()[-2]
    assert "(within 1% of the limit" in tight and "(within" not in verdict
    table = lines[lines.index(next(x for x in lines if "the plans that fit" in x)) + 2:]
    first, second = table[0].split(), table[1].split()
    assert first[:2] == ["1", "HSDP"] and table[0].endswith("<- the command")
    assert second[:2] == ["2", "ZeRO-3/FSDP"] and float(second[4]) == 1.08  # the plan printed before
    assert float(first[3].replace(",", "")) < float(second[3].replace(",", ""))  # step ms: faster


def test_a_plan_that_fits_at_its_micro_batch_keeps_it_and_says_what_its_command_sends():
    text = budget.plan(["--model", "124M", "--gpus", "8", "--gpu", "H100"])["text"]
    lines = text.splitlines()
    assert not any("the plans that fit" in x for x in lines)
    assert "--micro-batch 8 " in lines[-1] and "--shard ddp " in lines[-1]
    assert lines[-2].startswith("verdict     the command below: DDP at micro-batch 8; ")
    assert "shorter than backward" in lines[-2]


# ---- the data the command reads (C12) -------------------------------------------------------------------

def test_the_book_corpus_size_is_the_data_train_gpu_reads_by_default():
    from data import load_tokens
    assert budget.BOOK_TRAIN_TOKENS == len(load_tokens().train)


def test_a_plan_beyond_the_book_corpus_names_data_and_says_why():
    text = budget.plan(["--model", "124M", "--gpus", "8"])["text"]
    line = next(x for x in text.splitlines() if x.startswith("data "))
    passes = budget.plan(["--model", "124M", "--gpus", "8"])["est"]["tokens"] / budget.BOOK_TRAIN_TOKENS
    assert f"{passes:,.0f} passes over the book's 1,551,939 training tokens" in line
    assert "its vocabulary is 50,257, not the book tokenizer's 8,192" in line
    assert " --data DATA --out " in text.splitlines()[-1]
    # the book's own model on the book's tokens, for less than one pass: the default data, no --data
    small = budget.plan(["--model", "book-29M", "--gpus", "1", "--tokens", "1e6"])["text"]
    assert "--data" not in small.splitlines()[-1]
    assert next(x for x in small.splitlines() if x.startswith("data ")).startswith(
        "data        1,000,000 tokens, 0.64 of a pass over the book's")
    # the book's model for longer than the corpus: --data too
    assert " --data DATA " in budget.plan(["--model", "book-29M", "--gpus", "1"])["text"].splitlines()[-1]


# ---- where data parallelism stops (chapter 8) ------------------------------------------------------------

def test_a_sequence_that_fits_no_gpu_says_data_parallelism_stops_and_why():
    text = budget.plan(["--model", "7B", "--gpus", "8", "--gpu", "RTX3060", "--seq-len", "65536"])["text"]
    last = text.splitlines()[-1]
    assert last.startswith("command     none: not even one sequence per GPU fits")
    assert "more GPUs cannot fit it either" in last and "context parallelism" in last
    assert not any(x.startswith("data ") for x in text.splitlines())  # no command, no --data to explain
    # where more GPUs do help (ZeRO-3's shards shrink), it says so instead
    text = budget.plan(["--model", "7B", "--gpus", "8", "--gpu", "RTX3060", "--seq-len", "8192"])["text"]
    assert text.splitlines()[-1].endswith("shard over more GPUs (see the verdict)")


def test_one_sequence_per_gpu_beyond_the_batch_says_data_parallelism_stops():
    line = next(x for x in budget.plan(["--model", "124M", "--gpus", "1024", "--micro-batch", "1"])["text"]
                .splitlines() if x.startswith("batch "))
    assert "one sequence on every GPU, more than the 524,288 asked" in line
    assert "data parallelism stops here" in line and "pipeline parallelism" in line
