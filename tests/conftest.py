import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "code"))


def pytest_collection_modifyitems(config, items):
    """Skip nbval cells tagged `cuda` where there is no CUDA (they run where it exists)."""
    import pytest
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
