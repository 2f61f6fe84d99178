"""Search finds the book's own terms: every term of the glossary, searched in the built book.

jieba cuts a compound it does not know (微批次 into 微 + 批次), and the page's search looks a Chinese query
up whole, so without the user dictionary that bookbuild/search_terms.py makes from the glossary, a
search for 微批次 finds nothing. Two checks: jieba, given that dictionary, keeps every glossary word
whole in the chapters the glossary links it to (no browser); and in headless Chromium, the built book's
search page lists each of those chapters for each term (the way tests/test_browser.py drives it).
"""
import re
from urllib.parse import quote

import pytest
from test_browser import REPO, browser, open_page, site  # noqa: F401  (browser, site: the fixtures)

from bookbuild import search_terms

GLOSSARY = (REPO / search_terms.GLOSSARY).read_text(encoding="utf-8")
TERMS = [(word, pages) for words, pages in search_terms.glossary_terms(GLOSSARY) for word in words]


def test_the_glossary_is_read_as_terms_and_chapters():
    rows = search_terms.glossary_terms(
        "| 术语 | 英文 | 定义 | 章节 |\n|---|---|---|---|\n"
        "| 前向/反向 | forward | … | [第2章](02_speed.md) |\n"
        "| MFU（模型 FLOPs 利用率） | model FLOPs utilization | … | [第2章](02_speed.md)、[第7章](07_gpu.md) |\n"
        "| 参数量 $N$ | parameter count | … | [第1章](01_data_model.md) |\n")
    assert rows == [(["前向", "反向"], ["chapters/02_speed"]),
                    (["MFU"], ["chapters/02_speed", "chapters/07_gpu"]),
                    (["参数量"], ["chapters/01_data_model"])]
    assert len(TERMS) > 40 and ("微批次", ["chapters/03_accumulation", "chapters/07_gpu"]) in TERMS


def test_every_term_is_searchable():
    # Sphinx's Chinese search indexes no single character (SearchChinese.word_filter)
    assert not [w for w, _ in TERMS if len(w) < 2]


def test_jieba_keeps_every_glossary_word_whole_in_its_chapters(tmp_path):
    import jieba
    tokenizer = jieba.Tokenizer()
    tokenizer.load_userdict(str(search_terms.write_dictionary(REPO, tmp_path)))
    plain = jieba.Tokenizer()  # the default dictionary: what the index held before
    split = {}
    for word, pages in TERMS:
        if not re.search(r"[\u4e00-\u9fff]", word):
            continue
        for docname in pages:
            text = (REPO / f"{docname}.md").read_text(encoding="utf-8")
            assert word in text, f"{word!r}: the glossary links {docname}, which never uses it"
            if word.split()[0] not in set(tokenizer.cut_for_search(text)):
                split.setdefault(word, []).append(docname)
    assert not split, f"jieba with the glossary's dictionary still cuts these words apart: {split}"
    # and the dictionary is what makes the difference: without it jieba cuts 微批次 apart
    assert "微批次" not in set(plain.cut_for_search("每个微批次的损失除以 k"))


@pytest.mark.parametrize("word,pages", TERMS, ids=[w for w, _ in TERMS])
def test_search_finds_the_chapters_the_glossary_links(site, browser, word, pages):  # noqa: F811
    page, errors = open_page(browser, f"{site}/search.html?q={quote(word)}")
    try:
        # the search is done when its summary line says how many pages it found (or none)
        page.wait_for_function(
            "() => { const s = document.querySelector('#search-results p.search-summary');"
            " return s && s.innerText.trim().length > 0; }", timeout=30_000)
        hrefs = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")
        found = {m.group(1) for h in hrefs if (m := re.search(r"/(chapters/[^/#?]+)\.html", h))}
        missing = [p for p in pages if p not in found]
        assert not missing, f"searching {word!r} does not find {missing} (found {sorted(found)})"
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()
