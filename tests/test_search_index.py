"""Chinese full-text search really indexes Chinese words: the n-grams of bookbuild/search.py, with any word
a chapter uses found whole (学习率 was split by jieba and never found). Prints the index's size."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from bookbuild import search

REPO = Path(__file__).resolve().parent.parent


def test_chinese_words_from_a_chapter_are_in_the_search_index(tmp_path):
    book = tmp_path / "book"
    (book / "chapters").mkdir(parents=True)
    for name in ("00_front.md", "01_data_model.md"):
        shutil.copy(REPO / "chapters" / name, book / "chapters" / name)
    for folder in ("bookbuild", "_static"):  # _config.yml's local extension and favicon
        shutil.copytree(REPO / folder, book / folder, ignore=shutil.ignore_patterns("__pycache__"))
    config = yaml.safe_load((REPO / "_config.yml").read_text(encoding="utf-8"))
    config["execute"]["execute_notebooks"] = "off"  # the index is built from text; no need to run cells
    (book / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    (book / "_toc.yml").write_text(
        "format: jb-book\nroot: chapters/00_front\nchapters:\n  - file: chapters/01_data_model\n", encoding="utf-8")
    jb = Path(sys.executable).parent / "jupyter-book"
    result = subprocess.run([str(jb), "build", str(book)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    text = (book / "_build" / "html" / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(re.search(r"Search\.setIndex\((.*)\)\s*$", text, re.S).group(1))
    terms, docs = index["terms"], index["docnames"]
    chapter1 = docs.index("chapters/01_data_model")

    def pages(term):  # in the text or in a title: the page's search looks in both
        hits = []
        for table in (terms, index["titleterms"]):
            hit = table.get(term, [])
            hits += hit if isinstance(hit, list) else [hit]
        return hits

    for word in ("余弦", "交叉", "乐观", "学习率", "验证集", "训练集"):  # chapter 1's; jieba split the last 3
        for term in search.query_terms(word):
            assert chapter1 in pages(term), f"{word!r} from chapter 1 is not in the search index ({term!r})"
    print(f"searchindex.js of two pages: {len(text.encode()):,} bytes, {len(terms):,} terms")
    chinese = [t for t in terms if any("\u4e00" <= ch <= "\u9fff" for ch in t)]
    assert len(chinese) > 300, f"only {len(chinese)} Chinese terms indexed"


def test_ngrams_and_the_query_split_agree():
    assert search.ngrams("学习率 1e-3，验证集") == ["学习", "习率", "验证", "证集"]
    assert search.query_terms("学习率") == ["学习", "习率"]
    assert search.query_terms("微批次 all-reduce 的") == ["微批", "批次"]  # a single character is dropped
    text = "梯度裁剪和权重衰减都写在训练配方里"
    grams = set(search.ngrams(text))
    assert all(t in grams for w in ("梯度裁剪", "权重衰减", "训练配方") for t in search.query_terms(w))
