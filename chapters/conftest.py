"""nbval over the chapters. pytest needs a conftest here for the notebooks' items; the hooks live in
bookbuild/nbval_hooks.py: each chapter's kernel is traced, a chapter that passed is handed to the book
build's execution cache, and BOOK_NBVAL_CHANGED_ONLY=1 leaves out the chapters unchanged since they passed.
(Cells tagged `cuda` carry nbval's own `nbval-skip` tag; tests/conftest.py marks every nbval item slow.)"""
from bookbuild.nbval_hooks import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    pytest_runtest_setup,
)
