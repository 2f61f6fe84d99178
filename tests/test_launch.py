"""A chapter opened on its own (Colab, Binder, a downloaded .ipynb) fetches the book and runs.

Every chapter's first cell is the same hidden setup cell. Here it runs in an empty folder, with the
repository URL pointed at this checkout (git clone works the same on a local path), and must leave
the kernel in chapters/ of a fresh clone with code/ importable.
"""
import json
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = sorted(p for p in (REPO / "chapters").glob("*.md") if "jupytext:" in p.read_text(encoding="utf-8")[:400])
URL = yaml.safe_load((REPO / "_config.yml").read_text(encoding="utf-8"))["repository"]["url"]


def setup_cell(md):
    cell = next(c for c in jupytext.read(md).cells if c.cell_type == "code")
    return cell


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.name)
def test_first_cell_is_the_hidden_setup_cell(md):
    cell = setup_cell(md)
    assert "remove-cell" in cell.metadata.get("tags", []), "the setup cell should be hidden on the page"
    assert f'BOOK_REPO = "{URL}"' in cell.source, "the setup cell must fetch from _config.yml's repository.url"
    assert cell.source == setup_cell(CHAPTERS[0]).source, "every chapter has the same setup cell"


@pytest.mark.slow  # clones the book and runs the setup cell in a fresh process
def test_setup_cell_fetches_the_book_in_an_empty_folder(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    source = setup_cell(CHAPTERS[0]).source.replace(URL, str(REPO))
    probe = source + "\nimport model, data\nprint(__import__('json').dumps([str(Path.cwd()), model.__file__]))\n"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    cwd, model_file = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(cwd) == tmp_path / "train-faster-larger" / "chapters"
    assert Path(model_file).parent == tmp_path / "train-faster-larger" / "code"
