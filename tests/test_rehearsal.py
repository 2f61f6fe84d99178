"""bookbuild/rehearse.py: the covering set, the printed command as both parsers read it and as it is
shrunk, the held-bytes check; and (slow) the subset that uses every flag once, run for real."""
import itertools
import json
import subprocess
import sys
import time

import pytest

from bookbuild import rehearse
from bookbuild.book import REPO

HARDENED = ("--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --shutdown-timeout 170")


def test_the_pairwise_set_covers_every_pair_and_the_subset_every_value():
    f = rehearse.factors()
    rows = rehearse.covering(f, rehearse.valid)
    assert rows and all(rehearse.valid(r) for r in rows)
    assert rehearse.uncovered(f, rows, rehearse.valid) == set()
    assert rehearse.uncovered(f, rows[:-1], rehearse.valid)  # the check can fail: the last row was needed
    product = len([c for c in itertools.product(*f.values())])
    assert len(rows) < product / 10, (len(rows), product)
    one = rehearse.covering(f, rehearse.valid, strength=1)
    assert rehearse.uncovered(f, one, rehearse.valid, strength=1) == set()
    assert {r["launch"] for r in one} == set(rehearse.LAUNCHES) and {r["scheme"] for r in one} == set(f["scheme"])


def test_covering_of_a_small_product_by_hand():
    f = {"a": (0, 1), "b": (0, 1), "c": (0, 1)}
    rows = rehearse.covering(f)
    assert len(rows) == 4 and rehearse.uncovered(f, rows) == set()  # 3 binary factors: 4 rows suffice
    assert rehearse.uncovered(f, [{"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 1, "c": 1}]) == {
        (("a", 0), ("b", 1)), (("a", 0), ("c", 1)), (("a", 1), ("b", 0)), (("a", 1), ("c", 0)),
        (("b", 0), ("c", 1)), (("b", 1), ("c", 0))}
    # a pair no valid combination holds is not asked for
    assert (("a", 1), ("b", 1)) not in set().union(*(rehearse._tuples(r, 2) for r in rehearse.covering(
        f, lambda c: not (c["a"] and c["b"]))))


def _printed(hardened: bool, gpus: int = 8) -> str:
    line = rehearse.printed_commands(["--model", "124M", "--gpu", "H100", "--gpus", str(gpus)])[0]
    launcher, script = line.split(" code/train_gpu.py ")  # the budget's line, with or without launch/'s flags
    if hardened and "--shutdown-timeout" not in launcher:
        launcher += " " + HARDENED
    if hardened and "--auto-resume" not in script:
        script += " --out OUT --auto-resume"
    if not hardened:
        for flag in HARDENED.split()[::2]:
            launcher = " ".join(rehearse.without(tuple(launcher.split()), flag))
        script = " ".join(rehearse.with_switch(rehearse.without(tuple(script.split()), "--out"), "--auto-resume",
                                               False))
    return f"{launcher} code/train_gpu.py {script}"


@pytest.mark.parametrize("hardened", [False, True])
@pytest.mark.parametrize("gpus", [8, 16])
def test_a_printed_command_keeps_every_flag_and_changes_only_what_is_shrunk(tmp_path, hardened, gpus):
    printed = rehearse.parse_command(_printed(hardened, gpus))
    launches, per_node = (1, 4) if gpus == 8 else (2, 2)
    spec = rehearse.Spec("t", [], printed, launches, per_node, 2, 8)
    cmd = spec.command(tmp_path / "out", tmp_path / "tokens.bin", 12345, resume=True)
    flags = [t.split("=")[0] for t in cmd.launcher + cmd.args if t.startswith("--")]
    for t in printed.launcher + printed.args:  # every printed flag survives, once
        if t.startswith("--"):
            assert flags.count(t.split("=")[0]) == 1, (t, cmd.text())
    assert rehearse.value(cmd.args, "--out") == str(tmp_path / "out") and "--auto-resume" in cmd.args
    assert rehearse.value(cmd.args, "--device") == "cpu" and rehearse.value(cmd.args, "--steps") == str(rehearse.STEPS)
    for flag, v in rehearse.SHAPE.items():
        assert rehearse.value(cmd.args, flag) == str(v)
    assert rehearse.value(cmd.args, "--global-batch-tokens") == str(8 * 32 * 4 * 2)  # micro × seq × world × accum
    assert rehearse.value(cmd.args, "--micro-batch") == "8"
    assert rehearse.world_of(cmd.launcher) == (launches, per_node)
    if hardened:
        assert rehearse.value(cmd.launcher, "--shutdown-timeout") == "170"
        assert rehearse.value(cmd.launcher, "--signals-to-handle").endswith("SIGUSR1")
    if gpus == 16:
        assert rehearse.value(cmd.launcher, "--rdzv-endpoint") == "127.0.0.1:12345"
        assert rehearse.value(cmd.launcher, "--rdzv-conf") == f"join_timeout={rehearse.JOIN_TIMEOUT_S}"
        assert "HOST" not in cmd.text() and "OUT" not in cmd.args
    rehearse.parse_command(cmd.text())  # what runs is still what both parsers take


def test_a_flag_either_parser_does_not_take_fails_the_rehearsal():
    with pytest.raises(rehearse.Refused, match="train_gpu.py refuses it: .*--no-such-flag"):
        rehearse.parse_command("torchrun --standalone --nproc-per-node=1 code/train_gpu.py --no-such-flag 3")
    with pytest.raises(rehearse.Refused, match="refuses it: .*--no-such-launcher-flag"):
        rehearse.parse_command("torchrun --no-such-launcher-flag code/train_gpu.py --steps 3")


def test_flag_editing_keeps_the_printed_form():
    t = ("--nproc-per-node=8", "--x", "1", "--x", "2", "--sw")
    assert rehearse.with_value(t, "--nproc-per-node", 4) == ("--nproc-per-node=4", "--x", "1", "--x", "2", "--sw")
    assert rehearse.with_value(t, "--x", 5) == ("--nproc-per-node=8", "--x", "5", "--sw")
    assert rehearse.with_value(t, "--y", 5)[-2:] == ("--y", "5")
    assert rehearse.without(t, "--sw", takes_value=False) == t[:-1]
    assert rehearse.value(t, "--x") == "2" and rehearse.value(t, "--nproc-per-node") == "8"


def test_every_printed_flag_set_is_run_once_with_its_plans():
    specs, none = rehearse.plan_specs(models=("124M", "1.3B", "7B"))
    assert all(s.checks != ("parse",) for s in specs), [s.group for s in specs if s.checks == ("parse",)]
    keys = [rehearse._key(s) for s in specs]
    assert len(set(keys)) == len(keys)
    for s in specs:
        for argv in s.plans:  # each plan's printed command shrinks to its spec's command
            cmd = rehearse.parse_command(rehearse.printed_commands(argv)[0])
            assert rehearse.scheme_of(cmd.args) == rehearse.scheme_of(s.printed.args)
            assert ("--checkpoint-activations" in cmd.args) == ("--checkpoint-activations" in s.printed.args)
    schemes = {rehearse.scheme_of(s.printed.args) for s in specs}
    assert {"ddp", "zero2"} <= schemes, schemes


def test_the_held_check_compares_each_part_with_the_ledger(tmp_path):
    printed = rehearse.parse_command(_printed(False))
    spec = rehearse.Spec("t", [], printed, 1, 2, 2, 4)
    cmd = spec.command(tmp_path, tmp_path / "t.bin", 0)
    e = rehearse.ledger_parts(cmd, 1)
    line = (f"state held by process 0, counted from its local shards: weights {e['weights']} MiB, grads "
            f"{e['grads']} MiB, optimizer {e['optimizer']} MiB (ledger {e['in all']} MiB in all)\n")
    o = rehearse.Outcome(line, "", {}, 0, False, False)
    assert rehearse.check_held(o, cmd, 1) is None
    assert float(e["optimizer"]) == pytest.approx(2 * float(e["weights"]), abs=0.011)  # AdamW's two moments
    o.stdout = line.replace(f"grads {e['grads']}", "grads 9.99")
    assert "grads 9.99 (ledger" in rehearse.check_held(o, cmd, 1)
    o.stdout = ""
    assert "no 'state held" in rehearse.check_held(o, cmd, 1)


def test_the_tolerance_is_the_equality_tests_one():
    sys.path.insert(0, str(REPO / "tests"))
    from test_train_gpu import TOL
    assert rehearse.TOL == TOL


def test_each_precision_is_compared_within_its_own_tolerance():
    """fp32 within TOL, fp16 within TOL_FP16, bf16 within TOL_BF16 (its 8-bit mantissa: a bf16 run on
    another micro-batch ends 2.9e-5 away, beyond TOL)."""
    def spec(*extra):
        return rehearse.Spec("x", [], rehearse.Command((), "code/train_gpu.py", ()), 1, 1, 1, 1, extra=extra)
    assert spec().tol() == spec("--compile").tol() == rehearse.TOL
    assert spec("--precision", "fp16").tol() == rehearse.TOL_FP16
    assert spec("--compile", "--precision", "bf16").tol() == rehearse.TOL_BF16
    assert rehearse.TOL < 2.9e-5 < rehearse.TOL_BF16


@pytest.mark.slow
def test_the_subset_runs_every_flag_and_passes_every_check(tmp_path):
    """Every option value once (the 1-wise covering set) and one printed sharded flag set, run for real."""
    specs, _ = rehearse.matrix(subset=True)
    used = {t.split("=")[0] for s in specs for t in s.command(tmp_path, tmp_path, 0).launcher +
            s.command(tmp_path, tmp_path, 0).args if t.startswith("--")}
    assert {"--shard", "--no-reshard-after-forward", "--grad-sync", "--checkpoint-activations", "--compile",
            "--precision", "--nnodes", "--rdzv-endpoint", "--standalone"} <= used, used
    assert {"stop", "resume", "equal", "held"} <= {c for s in specs for c in s.checks}
    assert {s.options.get("grad_sync") for s in specs} >= {"last", "every"}
    t0 = time.perf_counter()
    out = tmp_path / "rehearsal.json"
    r = subprocess.run([sys.executable, "-m", "bookbuild.rehearse", "--subset", "--output", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=1200)
    print(r.stdout[-4000:], f"\nsubset: {time.perf_counter() - t0:.0f} s")
    report = json.loads(out.read_text())
    assert r.returncode == 0 and not report["failed"], r.stdout[-3000:] + r.stderr[-2000:]
    assert len(report["runs"]) == len(specs) and all(x["result"] == "ok" for x in report["runs"])
    assert (out.with_suffix(".md")).read_text().startswith("| run | plan | flags |")


def test_every_resume_keeps_the_global_batch_and_the_precision():
    plans, _ = rehearse.plan_specs(models=("124M", "1.3B"))
    specs = rehearse.pairwise_specs() + rehearse.plan_checks(plans)
    resumed = [s for s in specs if s.resume_as is not None]
    assert resumed and all("stop" in s.checks and "resume" in s.checks for s in resumed)
    assert any(s.resumes_as_is() for s in resumed) and any(not s.resumes_as_is() for s in resumed)
    for s in resumed:
        r = s.resume_as
        assert r.micro * r.world * r.accum == s.micro * s.world * s.accum, (s.name, r.name)
        assert rehearse.value(r.extra, "--precision") == rehearse.value(s.extra, "--precision")
    elsewhere = {(s.resume_as.world, rehearse.scheme_of(s.resume_as.printed.args)) for s in resumed
                 if not s.resumes_as_is()}
    assert len(elsewhere) >= 3, elsewhere


def test_16_bit_runs_are_compared_only_under_the_same_casts():
    row = {"launch": "2", "scheme": "zero3", "precision": "fp16", "compile": False}
    assert rehearse.group_of(row) != rehearse.group_of({**row, "scheme": "ddp"})
    assert rehearse.group_of(row) != rehearse.group_of({**row, "compile": True})
    assert rehearse.group_of({**row, "precision": "fp32"}) == rehearse.group_of(
        {**row, "precision": "fp32", "scheme": "ddp", "compile": True})


def test_a_failure_is_said_by_the_error_s_last_line():
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1\ntorch._dynamo.exc.Unsupported: "
          "a graph break\n[rank0]: more\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
          "=====\nFailures:\n  <NO_OTHER_FAILURES>\n")  # torchrun's report, after the worker's error
    assert rehearse.why(rehearse.Outcome("", tb, {}, 0, False, False)) == "torch._dynamo.exc.Unsupported: a graph break"
    said = rehearse.Outcome("", "error: --d-model 5 must split into --n-head 2 heads\n" + tb, {}, 0, False, False)
    assert rehearse.why(said).startswith("error: --d-model 5")
    assert "no end within" in rehearse.why(rehearse.Outcome("", "", {}, 0, True, False))


def test_each_run_compiles_into_its_own_cache_and_a_killed_launch_removes_it(tmp_path, monkeypatch):
    """A launch killed mid-compile can leave a truncated kernel in its torch.compile cache: no other run
    shares that cache, and the kill removes it."""
    show = ("import os, pathlib; d = os.environ['TORCHINDUCTOR_CACHE_DIR']; pathlib.Path(d).mkdir(exist_ok=True); "
            "print(d)")
    monkeypatch.setattr(rehearse.Command, "argv", lambda self: [sys.executable, "-c", self.script])
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "shared"))  # the caller's is not used
    seen = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        o = rehearse.launch(rehearse.Command((), show, ()), 1, tmp_path / name)
        seen.append(o.stdout.strip())
    assert seen == [str(tmp_path / n / rehearse.INDUCTOR_DIR) for n in ("a", "b")], seen
    hang = show + "; import time; time.sleep(60)"
    o = rehearse.launch(rehearse.Command((), hang, ()), 1, tmp_path / "a", timeout_s=3)
    assert o.timed_out and not (tmp_path / "a" / rehearse.INDUCTOR_DIR).exists()
    assert (tmp_path / "b" / rehearse.INDUCTOR_DIR).is_dir()
