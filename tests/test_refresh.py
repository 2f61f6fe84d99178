"""bookbuild.refresh --markdown-only: prose copied into the .ipynb, stored outputs kept; refused once code differs."""
import jupytext
import nbformat
import pytest

from bookbuild import refresh

CHAPTER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A page

Old prose.

```{code-cell} ipython3
print("ran")
```
"""


def test_markdown_only_copies_prose_and_keeps_outputs(tmp_path):
    md = tmp_path / "09_x.md"
    md.write_text(CHAPTER, encoding="utf-8")
    nbformat.write(refresh.execute(md, timeout=120), md.with_suffix(".ipynb"))
    md.write_text(CHAPTER.replace("Old prose.", "New prose."), encoding="utf-8")
    refresh.copy_markdown(md)
    nb = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    assert "New prose." in nb.cells[0].source and nb.cells[1].outputs[0]["text"] == "ran\n"
    assert [c.source for c in jupytext.read(md).cells] == [c.source for c in nb.cells]


def test_markdown_only_refuses_changed_code(tmp_path, capsys):
    md = tmp_path / "09_x.md"
    md.write_text(CHAPTER, encoding="utf-8")
    nbformat.write(refresh.execute(md, timeout=120), md.with_suffix(".ipynb"))
    md.write_text(CHAPTER.replace('"ran"', '"changed"'), encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        refresh.copy_markdown(md)
    assert e.value.code == 1 and "code cells differ" in capsys.readouterr().err
