"""The glossary's terms, read from chapters/glossary.md: each term's words and the chapters that teach it.

One list serves the glossary and the search: search.py ranks the chapters the glossary links a term to
first when the query is that term, and tests/test_search_terms.py searches every term in the built
book. (The search once also needed them as a jieba user dictionary, so that jieba would keep 微批次
whole; the n-gram index finds every word without one.)
"""
import re
from pathlib import Path

GLOSSARY = Path("chapters") / "glossary.md"  # relative to the book's source folder
_LINK = re.compile(r"\]\(([^)#]+?)\.md\)")


def glossary_terms(text: str) -> list[tuple[list[str], list[str]]]:
    """(the search words of a term, the docnames the glossary links it to) for each row of its tables.

    A term cell names one concept, e.g. "微批次", "前向/反向", "MFU（模型 FLOPs 利用率）", "参数量 $N$": its
    words are the names outside the brackets and the math, split at "/" and "、"."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 2 or cells[0] == "术语" or set(cells[0]) <= set("-: "):
            continue  # not a table row, or a table's header
        name = re.sub(r"\$[^$]*\$", "", re.sub(r"（[^）]*）", "", cells[0]))
        words = [w.strip() for w in re.split(r"[/、]", name) if w.strip()]
        pages = [f"chapters/{p.split('/')[-1]}" for p in _LINK.findall(cells[-1])]
        if words and pages:
            rows.append((words, pages))
    return rows
