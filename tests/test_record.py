"""code/record.py, the run record's torch-free module: importing it, or the book's provenance page that
reads it, does not import torch; measure.py re-exports it instead of keeping a copy."""
import subprocess
import sys

import pytest

from data import REPO

PROBE = "import sys; sys.path.insert(0, 'code'); {code}; print(sorted({{'torch', 'measure'}} & set(sys.modules)))"


@pytest.mark.parametrize("code", [
    "import record; record.git_state(), record.git_commit(), record.cpu_name(), record.cpu_flags()",
    "import bookbuild.nbval_hooks as h; h.is_the_books_run()",  # the emulation variables, from record.py
    "import bookbuild.provenance, bookbuild.gpu_run, bookbuild.refresh",
], ids=["record", "nbval_hooks", "bookbuild"])
def test_the_record_and_the_build_do_not_import_torch(code):
    p = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[-2] == "[]", p.stdout + p.stderr


def test_measure_reexports_the_record_without_a_copy():
    import measure
    import record
    for name in ("git_state", "git_commit", "cpu_name", "cpu_flags", "cpu_isa", "experiment_record",
                 "EMULATION_VARS"):
        assert getattr(measure, name) is getattr(record, name), name
    commit, dirty = record.git_state()
    assert commit is None or len(commit) == 40 and isinstance(dirty, bool)
