"""A sentence that says a number fell shows it falling: every stored page's prose, with its own glued values in.

Each chapter's Markdown cells are rendered with the values its stored .ipynb glued (what a reader of that page
sees), and every "从 A … 降到 B" in one clause must have A > B ("升到"/"涨到"/"增加到": A < B). A branch that
compares one quantity and prints another (milliseconds against shares, H2 of the review) fails here on the
outcome that was stored.
"""
import ast
import re

import nbformat
import pytest

from bookbuild import book

GLUE = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)(?::[^`]*)?`")
NUM = r"(-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)"
CHANGE = re.compile(rf"从[^，。；：从\n]*?{NUM}[^，。；：从\n\d]*?(降到|降至|减到|减少到|升到|涨到|增加到)了?"
                    rf"[^，。；：\n\d]*?{NUM}")
FALLS = {"降到", "降至", "减到", "减少到"}


def glued_values(nb) -> dict:
    """{name: the text a page shows for it} of every value the stored notebook glued."""
    values = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            scrap = out.get("metadata", {}).get("scrapbook")
            if scrap:
                raw = out.get("data", {}).get(scrap["mime_prefix"] + "text/plain", "")
                try:
                    values[scrap["name"]] = str(ast.literal_eval(raw))
                except (ValueError, SyntaxError):
                    values[scrap["name"]] = raw
    return values


def rendered_prose(nb) -> str:
    values = glued_values(nb)
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    return GLUE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def wrong_changes(text: str) -> list[str]:
    """Each "从 A … 降到 B" whose numbers do not fall (or "升到" whose do not rise)."""
    wrong = []
    for m in CHANGE.finditer(text):
        before, verb, after = float(m.group(1).replace(",", "")), m.group(2), float(m.group(3).replace(",", ""))
        if (before <= after) if verb in FALLS else (before >= after):
            wrong.append(m.group(0))
    return wrong


def test_the_rule_reads_a_change_in_one_clause():
    assert wrong_changes("词表上的 softmax 和交叉熵从全部 logits 写法的 3% 降到了 18%。") == [
        "从全部 logits 写法的 3% 降到了 18"]
    assert wrong_changes("内存峰值从 355 MiB 降到 120 MiB，学习率从 1e-3 降到 3e-4，从 204 MiB 涨到 331 MiB。") == []
    assert wrong_changes("从 1,024 降到 2,048；从 8 升到 1") == ["从 1,024 降到 2,048", "从 8 升到 1"]
    assert wrong_changes("从 8 开始。然后降到 9") == []  # two clauses: no change said


@pytest.mark.parametrize("md", book.chapters(), ids=lambda p: p.stem)
def test_a_stored_page_says_a_number_fell_only_when_it_did(md):
    nb = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    wrong = wrong_changes(rendered_prose(nb))
    assert not wrong, f"{md.stem} says a number fell (rose) where it rose (fell): {wrong}"
