"""The exercises (exercises/, issue 30) checked against the book itself: for every exercise the book's
solution and a second correct answer written differently pass, each deliberately wrong answer in
exercises/wrong/ fails with its own sentence, and the untouched skeleton says "not written yet" in one
line. The multi-process exercises start torch.distributed.run on gloo, so they are slow; the others
run on the fast path. Then the reader's own command, python -m pytest exercises -k NAME, once."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exercises import checks

ROOT = Path(__file__).resolve().parent.parent
N = r"[-+]?[\d,.e+]+"  # a number as the sentences print it

# exercises/wrong/NAME__WHAT.py -> the sentence it must get (a regular expression, matched whole)
WRONG = {
    "ch2_flops": {
        "no_attention": rf"for \{{.*\}}: yours is {N} FLOPs per token, measure\.flops_per_token's is {N} \(-{N}; "
                        r"attention's QKᵀ and PV, which no parameter counts, are missing\)",
        "forward_only": rf"for \{{.*\}}: yours is {N} FLOPs per token, measure\.flops_per_token's is {N} \(-{N}; "
                        r"only the forward pass is counted \(backward costs twice as much\)\)",
        "untied": rf"for \{{.*\}}: yours is {N} FLOPs per token, measure\.flops_per_token's is {N} \(\+{N}; "
                  r"the tied embedding is counted twice\)",
    },
    "ch4_loss_scaler": {
        "never_grows": rf"step \d+: after update\(\) your scale is {N}, torch\.amp\.GradScaler's is {N}",
        "never_skips": r"step \d+: torch\.amp\.GradScaler skipped the optimizer step and yours took it "
                       r"\(a gradient overflowed\)",
        "no_unscale": rf"parameter [\w.]+ differs from torch\.amp\.GradScaler's run at step \d+ by up to {N}",
    },
    "ch5_accumulation": {
        "not_divided": rf"the gradient of tok_emb\.weight differs from the whole batch's \(k=4 micro-batches\) by up "
                       rf"to {N}; yours is 4× its size",
        "zero_grad_each": rf"the gradient of [\w.]+ differs from the whole batch's \(k=4 micro-batches\) by up to "
                          rf"{N}; yours is 0\.\d+× its size",
        "last_loss": rf"your returned loss is {N}; the whole batch's mean loss is {N}",
    },
    "ch6_ddp": {
        "no_all_reduce": rf"all_reduce_gradients, step 0: the gradient of [\w.]+ differs from one process's on the "
                         rf"whole batch by up to {N}; yours is {N}× its size",
        "not_averaged": rf"all_reduce_gradients, step 0: the gradient of [\w.]+ differs from one process's on the "
                        rf"whole batch by up to {N}; yours is 2× its size",
        "all_after_backward": r"BucketedDDP, step 0: no all-reduce started during backward; start each bucket's "
                              r"from a gradient hook so it overlaps with the rest of backward",
        "one_per_parameter": r"BucketedDDP, step 0: (\d+) all-reduces for \1 parameters; with bucket_bytes=16384 the "
                             r"gradients go in buckets, more than one and fewer than one per parameter",
    },
    "ch7_ring_allreduce": {
        "uses_all_reduce": r"rank 0 called all_reduce; a ring all-reduce needs only send and recv",
        "no_all_gather": rf"rank 0, 1536 numbers: element \d+ is {N}, dist\.all_reduce gives {N}",
        "send_to_all": r"rank 0 sent 12,288 bytes with send/isend for a 6,144-byte tensor; a ring all-reduce over "
                       r"3 processes sends 2·\(G−1\)/G of it, 8,192",
    },
    "ch7_zero1": {
        "not_sharded": rf"after step 0 rank 0 holds ({N}) bytes of optimizer state; the ledger's ZeRO-1 row "
                       rf"\(memory\.state_bytes\) holds {N} for {N} parameters over 2 processes",
        "no_broadcast": rf"parameter [\w.]+ differs from one process's AdamW after step 0 by up to {N}",
        "shard_by_parameter": rf"after step 0 rank 0 holds {N} bytes of optimizer state; the ledger's ZeRO-1 row "
                              rf"\(memory\.state_bytes\) holds {N} for {N} parameters over 2 processes",
    },
    "ch7_fsdp": {
        "not_averaged": rf"after step 0, parameter [\w.]+ differs from one process's by up to {N} "
                        r"\(fp32 FSDP is exact\)",
        "all_reduce": r"step 0: rank 0 made no reduce_scatter call; FSDP all-gathers the weights and "
                      r"reduce-scatters the gradients",
        "never_frees": rf"step 0: after after_backward\(\) rank 0's model still holds {N} numbers of whole weights; "
                       r"free them, FSDP keeps only the shards between uses",
        "whole_copies": rf"rank 0 keeps ({N}) numbers of the \1 parameters; its shard is 1/2 of them",
    },
    "ch12_memory_peak": {
        "no_temporaries": rf"for Shape\(.*\): your peak is {N} bytes, memory\.step_bytes's is {N} \(-{N}; "
                          r"missing: the ledger's 'logit temporaries'\)",
        "no_weight_copies": rf"for Shape\(.*\): your peak is {N} bytes, memory\.step_bytes's is {N} \(-{N}; "
                            r"missing: the ledger's 'weight copies'\)",
        "rule_of_thumb": rf"for Shape\(.*\): your peak is {N} bytes, memory\.step_bytes's is {N} \(-{N}\)",
    },
}


def pristine(path: Path) -> bool:
    """Whether the file is the committed skeleton (a reader who has started it keeps their work)."""
    rel = path.relative_to(ROOT).as_posix()
    try:
        committed = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return committed.returncode == 0 and committed.stdout == path.read_bytes()


def test_every_exercise_has_its_files():
    assert len(checks.EXERCISES) >= 8
    assert set(WRONG) == set(checks.EXERCISES)
    for name in checks.EXERCISES:
        assert (checks.HERE / f"{name}.py").is_file()
        assert (checks.HERE / "solutions" / f"{name}.py").is_file()
        assert (checks.HERE / "solutions" / "alt" / f"{name}.py").is_file()
        on_disk = {p.stem.split("__", 1)[1] for p in (checks.HERE / "wrong").glob(f"{name}__*.py")}
        assert on_disk == set(WRONG[name]), f"{name}: exercises/wrong/ holds {sorted(on_disk)}"
        assert len(on_disk) >= 2


def answers(name: str) -> list:
    """The files test_exercise checks: the solution, the second correct answer, the wrong ones, the skeleton."""
    return [checks.HERE / "solutions" / f"{name}.py", checks.HERE / "solutions" / "alt" / f"{name}.py",
            *(checks.HERE / "wrong" / f"{name}__{what}.py" for what in WRONG[name]), checks.HERE / f"{name}.py"]


@pytest.fixture(scope="module")
def launched():
    """checks.verdicts of every multi-process exercise, their launches started together (each in a thread
    that waits on its torchrun): {name: verdicts}."""
    from concurrent.futures import ThreadPoolExecutor
    names = [name for name, nproc in checks.EXERCISES.items() if nproc]
    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(lambda name: checks.verdicts(name, answers(name)), names)))


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if nproc else [])
                                  for name, nproc in checks.EXERCISES.items()])
def test_exercise(name, request):
    skeleton = checks.HERE / f"{name}.py"
    paths = answers(name)
    # a multi-process exercise's launch, started with the others'; a one-process exercise here
    verdicts = request.getfixturevalue("launched")[name] if checks.EXERCISES[name] else checks.verdicts(name, paths)
    solution, alt, *caught, unwritten = verdicts
    assert solution is None, f"the book's solution fails: {solution}"
    assert alt is None, f"the second correct answer fails: {alt}"
    for (what, pattern), sentence in zip(WRONG[name].items(), caught):
        assert sentence is not None, f"the wrong answer {what} passes"
        assert re.fullmatch(pattern, sentence), f"the wrong answer {what} gets: {sentence}"
    if pristine(skeleton):
        assert unwritten == f"not written yet: edit exercises/{name}.py"


def reader_command(k: str, answers: str | None = None) -> subprocess.CompletedProcess:
    # a reader's own shell: no PYTEST_ADDOPTS of the pytest that runs this test (e.g. --durations) in its output
    env = {k_: v for k_, v in os.environ.items() if k_ not in (checks.ANSWERS_ENV, "PYTEST_ADDOPTS")}
    if answers:
        env[checks.ANSWERS_ENV] = answers
    return subprocess.run([sys.executable, "-m", "pytest", "exercises", "-k", k], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_reader_command():
    """What a reader types: the book's answers pass; an unwritten skeleton fails in one line."""
    done = reader_command("flops or accumulation", answers="solutions")
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-2000:]
    if not all(pristine(checks.HERE / f"{name}.py") for name in ("ch2_flops", "ch5_accumulation")):
        pytest.skip("you have started exercises/ch2_flops.py or ch5_accumulation.py; the skeletons' output "
                    "is checked on an untouched clone")
    todo = reader_command("flops or accumulation")
    assert todo.returncode == 1
    failures = todo.stdout.split("= FAILURES =")[1].split("short test summary")[0]
    lines = [line for line in failures.splitlines() if line.strip() and not line.startswith(("_", "="))]
    assert lines == ["not written yet: edit exercises/ch2_flops.py",
                     "not written yet: edit exercises/ch5_accumulation.py"], todo.stdout[-2000:]
    assert "Traceback" not in todo.stdout and "NotImplementedError" not in todo.stdout
