"""nbval over the chapters. pytest needs a conftest here for the notebooks' items; the hooks live in
bookbuild/nbval_hooks.py: cells tagged `cuda` are skipped without CUDA, and a chapter that passed is
handed to the book build's execution cache."""
from bookbuild.nbval_hooks import pytest_collection_modifyitems, pytest_runtest_makereport  # noqa: F401
