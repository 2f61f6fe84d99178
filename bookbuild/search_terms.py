"""The glossary's terms as the search index's vocabulary: one list serves the glossary and the search.

jieba's default dictionary does not know the book's compounds: it cuts 微批次 into 微 + 批次 and 混合精度
into 混合 + 精度, Sphinx drops the single 微, and the page's search looks a Chinese query up whole, so a
search for 微批次 finds nothing. Sphinx's Chinese search loads a jieba user dictionary named by
`html_search_options["dict"]`; with it, `jieba.cut_for_search` emits the compound and its parts.

This module reads the terms from chapters/glossary.md (the first column of its tables), writes them
as that dictionary, and points the build at it (sphinx_ext.py calls `use_glossary_dictionary` when
the configuration is read). tests/test_search_terms.py searches every term in the built book.
"""
import hashlib
import re
from pathlib import Path

GLOSSARY = Path("chapters") / "glossary.md"  # relative to the book's source folder
FREQ = 100  # the least frequency a term gets; tests/test_search_terms.py checks jieba keeps each whole
_LINK = re.compile(r"\]\(([^)#]+?)\.md\)")
_CJK = re.compile(r"[\u4e00-\u9fff]")


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


def dictionary_words(text: str) -> list[str]:
    """The glossary's Chinese words, in order, each once: what jieba must keep whole."""
    words = []
    for term_words, _ in glossary_terms(text):
        for w in term_words:
            for part in w.split():  # "环形 all-reduce": jieba needs only the Chinese word
                if _CJK.search(part) and len(part) > 1 and part not in words:
                    words.append(part)
    return words


def dictionary(text: str) -> str:
    """jieba's user-dictionary format: one `word frequency tag` a line. A word jieba knows keeps its own
    frequency when that is higher, so adding a term never makes a common word rarer."""
    import jieba
    lines = []
    for w in dictionary_words(text):
        freq = max(FREQ, jieba.get_FREQ(w) or 0, jieba.suggest_freq(w, tune=False))
        lines.append(f"{w} {freq} n")
    return "\n".join(lines) + "\n"


def write_dictionary(srcdir: Path, folder: Path) -> Path:
    """The user dictionary made from srcdir's glossary, written under folder. Its name carries a hash of
    its content, so a changed glossary is a changed configuration and Sphinx re-indexes every page."""
    text = dictionary((Path(srcdir) / GLOSSARY).read_text(encoding="utf-8"))
    path = Path(folder) / f"jieba-userdict-{hashlib.sha256(text.encode()).hexdigest()[:12]}.txt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


def use_glossary_dictionary(app, config) -> None:
    """config-inited: html_search_options' `dict` is the glossary's dictionary (an absolute path:
    Sphinx opens it relative to the working directory, and says nothing when it is missing)."""
    if not (Path(app.srcdir) / GLOSSARY).is_file():  # a partial copy of the book without the glossary
        return
    path = write_dictionary(app.srcdir, Path(app.doctreedir).parent / "search")
    config.html_search_options = {**(config.html_search_options or {}), "dict": str(path.resolve())}
