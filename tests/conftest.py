"""Which tests are slow, decided here: `python -m pytest -m "not slow"` is the fast path (the unit tests
of code/ and bookbuild/, under two minutes on two cores); `python -m pytest` runs everything.

Slow: every nbval item (each re-executes a chapter's cell), every test that takes the built book (the
`site` fixture of test_browser.py: the first one builds and executes the whole book), the tests of the
modules below, which drive headless Chromium, build a book or start processes that import torch and
train, and each test marked `@pytest.mark.slow` in a module that is otherwise fast (test_train_gpu.py
and test_launch.py mark every test that starts a process; their in-process refusals, --help and init
tests stay on the fast path, and no fast test starts torchrun).
"""
from pathlib import Path

import pytest

SLOW_MODULES = {
    "test_browser": "drives headless Chromium over the built book (builds it first)",
    "test_calculator": "drives headless Chromium over chapter 12's calculator",
    "test_search_index": "builds a two-page book",
    "test_ddp": "starts two processes with torch.distributed.run",
    "test_pdf": "builds the PDF with xelatex (and the book first, if no build has these inputs)",
}


def pytest_configure(config):
    missing = [name for name in SLOW_MODULES if not (Path(__file__).parent / f"{name}.py").is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: SLOW_MODULES names tests that do not exist: {missing}")


def is_slow(item) -> bool:
    if getattr(item, "cell", None) is not None:  # nbval's item: one cell of a chapter
        return True
    if "site" in getattr(item, "fixturenames", ()):  # the built book, served (test_browser.site)
        return True
    module = getattr(item, "module", None)
    return module is not None and module.__name__.rpartition(".")[2] in SLOW_MODULES


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
