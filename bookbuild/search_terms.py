"""The glossary's terms, read from chapters/glossary.md: each term's words and the chapters that teach it.

A term may name the other words readers use for it, in brackets after the term: "重算（也叫重计算、激活重计算）".
The book writes one term for each concept; the search takes these synonyms as that term (synonyms(): the
page's query splitter replaces each by its term, bookbuild/search.py), so 重计算 finds the pages on 重算.

One list serves the glossary and the search: search.py ranks the chapters the glossary links a term to
first when the query is that term, and tests/test_search_terms.py searches every term in the built
book. (The search once also needed them as a jieba user dictionary, so that jieba would keep 微批次
whole; the n-gram index finds every word without one.)
"""
import re
from pathlib import Path

GLOSSARY = Path("chapters") / "glossary.md"  # relative to the book's source folder
_LINK = re.compile(r"\]\(([^)#]+?)\.md\)")
_ALSO = re.compile(r"（也叫([^）]*)）")  # the synonyms of a term, in its cell: 重算（也叫重计算、激活重计算）


def glossary_terms(text: str) -> list[tuple[list[str], list[str]]]:
    """(the search words of a term, the docnames the glossary links it to) for each row of its tables.

    A term cell names one concept, e.g. "微批次", "前向/反向", "MFU（模型 FLOPs 利用率）", "参数量 $N$": its
    words are the names outside the brackets and the math, split at "/" and "、", then its synonyms
    (（也叫 …）)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 2 or cells[0] == "术语" or set(cells[0]) <= set("-: "):
            continue  # not a table row, or a table's header
        name = re.sub(r"\$[^$]*\$", "", re.sub(r"（[^）]*）", "", cells[0]))
        words = [w.strip() for w in re.split(r"[/、]", name) if w.strip()]
        words += [w.strip() for also in _ALSO.findall(cells[0]) for w in also.split("、") if w.strip()]
        pages = [f"chapters/{p.split('/')[-1]}" for p in _LINK.findall(cells[-1])]
        if words and pages:
            rows.append((words, pages))
    return rows


def synonyms(text: str) -> dict[str, str]:
    """Each synonym the glossary gives (（也叫 …） in a term's cell) -> the term the book writes for it."""
    found = {}
    for line in text.splitlines():
        cell = line.strip().strip("|").split("|")[0].strip() if line.startswith("|") else ""
        name = re.split(r"[/、（]", re.sub(r"\$[^$]*\$", "", cell))[0].strip()
        for also in _ALSO.findall(cell):
            found.update({w.strip(): name for w in also.split("、") if w.strip() and name})
    return found
