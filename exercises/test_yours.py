"""Your answers, checked: .venv/bin/python -m pytest exercises -k ddp (or flops, loss_scaler, accumulation, ring,
zero1, fsdp, memory_peak; no -k: all eight). Each test checks exercises/NAME.py, the file you edit,
against the book's own code and fails with one sentence saying what differs.

EXERCISES_ANSWERS=solutions checks the book's answers instead (exercises/solutions/, read them only
on purpose). The multi-process ones are marked slow, like every test that starts processes.
"""
import pytest

from exercises import checks


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if nproc else [])
                                  for name, nproc in checks.EXERCISES.items()])
def test_yours(name):
    sentence = checks.verdict(name, checks.reader_file(name))
    if sentence:
        pytest.fail(sentence, pytrace=False)  # one line, no traceback: the sentence says it all
