"""nbval: cells tagged `cuda` run only where CUDA exists; elsewhere they are skipped, not failed."""
import pytest

# Build matplotlib's font cache now: on a fresh machine the first import prints "Matplotlib is
# building the font cache" on stderr, which nbval would compare against the stored outputs.
import matplotlib.font_manager  # noqa: E402,F401


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="cell tagged `cuda` and this machine has no CUDA")
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and "cuda" in cell.get("metadata", {}).get("tags", []):
            item.add_marker(skip)
