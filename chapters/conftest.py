"""nbval over the chapters. pytest needs a conftest here for the notebooks' items; the hook lives in
bookbuild/nbval_hooks.py: a chapter that passed is handed to the book build's execution cache. (Cells
tagged `cuda` carry nbval's own `nbval-skip` tag; tests/conftest.py marks every nbval item slow.)"""
from bookbuild.nbval_hooks import pytest_runtest_makereport  # noqa: F401
