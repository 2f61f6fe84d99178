"""Search finds what a reader types: every glossary term, and words sampled from every chapter's text.

The index holds each page's Chinese character pairs (bookbuild/search.py), so any Chinese string of two or
more characters a page contains finds the page. Checked in headless Chromium on the built book (the way
tests/test_browser.py drives it):

- SAMPLE words (2-4 Chinese characters) drawn, with a fixed seed, from the prose of every chapter, not only
  glossary terms: each finds its chapter; the test prints the hit rate and must reach 100 %;
- every glossary term finds the chapters the glossary links it to, and the first of them is the first hit;
- a hit opens at the section that holds the word, not at the top of the page.
"""
import random
import re
from urllib.parse import quote

import pytest
from conftest import goto_ready
from test_browser import REPO, open_page

from bookbuild import book, search, search_terms

GLOSSARY = (REPO / search_terms.GLOSSARY).read_text(encoding="utf-8")
TERMS = [(word, pages) for words, pages in search_terms.glossary_terms(GLOSSARY) for word in words]


def test_the_glossary_is_read_as_terms_and_chapters():
    rows = search_terms.glossary_terms(
        "| 术语 | 英文 | 定义 | 章节 |\n|---|---|---|---|\n"
        "| 前向/反向 | forward | … | [第2章](02_speed.md) |\n"
        "| MFU（模型 FLOPs 利用率） | model FLOPs utilization | … | [第2章](02_speed.md)、[第11章](11_2_mfu.md) |\n"
        "| 参数量 $N$ | parameter count | … | [第1章](01_data_model.md) |\n")
    assert rows == [(["前向", "反向"], ["chapters/02_speed"]),
                    (["MFU"], ["chapters/02_speed", "chapters/11_2_mfu"]),
                    (["参数量"], ["chapters/01_data_model"])]
    assert len(TERMS) > 40 and ("微批次", ["chapters/05_accumulation", "chapters/10_gpu"]) in TERMS


def test_every_term_is_searchable():
    # Sphinx's Chinese search indexes no single character (SearchChinese.word_filter)
    assert not [w for w, _ in TERMS if len(w) < 2]


SEARCH_JS = """words => words.map(w => {
  const [query, terms, excluded, highlight, objects] = Search._parseQuery(w);
  return [w, Search._performSearch(query, terms, excluded, highlight, objects).map(r => r[0])];
})"""


def search_in_page(page, words) -> dict:
    """Each word's hits, as the search page's own code finds them (Search._performSearch, the function its
    query box calls), in the order the page lists them: it pops them from the end of what that returns."""
    page.wait_for_function("() => typeof Search !== 'undefined' && Search.hasIndex()", timeout=30_000)
    return {word: docnames[::-1] for word, docnames in page.evaluate(SEARCH_JS, words)}


# Sphinx's searchtools.js lists the hits one by one (_displayNextItem, a 5 ms timer apart) and fetches each hit's
# page for its excerpt (_displayItem's fetch); the summary line is written when the last hit is listed, not when
# the pages arrive. A hit's excerpt, and with it the section its link opens at (bookbuild/search.py sets
# data-section as it makes the excerpt), comes later, on a loaded machine after the summary line.
SEARCHED_JS = """() => {
  const summary = document.querySelector('#search-results p.search-summary');
  if (!summary || !summary.innerText.trim()) return false;
  return [...document.querySelectorAll('#search-results ul.search li')]
    .every(li => li.querySelector('p.context') || li.querySelector(':scope > span'));
}"""


def wait_until_searched(page):
    """The search is done: its summary line says how many pages it found (or none), and every hit listed
    has its excerpt (p.context; a hit with a description, which Sphinx fetches nothing for, its span)."""
    page.wait_for_function(SEARCHED_JS, timeout=30_000)


def read_in_page(browser, href, js, arg):
    """Open href in a page of its own (a search hit, as a reader clicks it), evaluate js(arg) there, close it."""
    target = browser.new_page()
    try:
        goto_ready(target, href)
        return target.evaluate(js, arg)
    finally:
        target.close()


def listed_chapters(hrefs) -> list[str]:
    return [m.group(1) for h in hrefs if (m := re.search(r"/(chapters/[^/#?]+)\.html", h))]


def test_search_finds_the_chapters_the_glossary_links(site, browser):
    # every term in one page, through the search's own code: one page per term took two minutes
    page, errors = open_page(browser, f"{site}/search.html?q=%E6%90%9C%E7%B4%A2")
    try:
        hits = search_in_page(page, [w for w, _ in TERMS])
        wrong = {}
        for word, pages in TERMS:
            found = [d for d in hits[word] if d.startswith("chapters/")]
            missing = [p for p in pages if p not in found]
            if missing or not found or found[0] != pages[0]:
                wrong[word] = f"links {pages}, search lists {found}"
        assert not wrong, f"terms whose search misses a linked chapter or starts elsewhere: {wrong}"
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


UI_TERMS = [TERMS[0][0], "微批次", TERMS[len(TERMS) // 2][0], TERMS[-1][0]]


@pytest.mark.parametrize("word", UI_TERMS)
def test_the_search_page_lists_what_its_search_finds(site, browser, word):
    # what a reader sees after typing the word: the same hits, in the same order, as search_in_page
    page, errors = open_page(browser, f"{site}/search.html?q={quote(word)}")
    try:
        wait_until_searched(page)
        hrefs = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")
        expected = [d for d in search_in_page(page, [word])[word] if d.startswith("chapters/")]
        assert listed_chapters(hrefs) == expected and expected, f"{word!r}: the page lists {hrefs}, not {expected}"
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


# ---- words sampled from every chapter ----

SAMPLE = 30  # words per chapter: 12 chapters make 360
SEED = 29


def prose(md) -> str:
    """A chapter's Markdown cells as a reader sees them: no code cells, glued values, math, link targets
    or front matter."""
    text = md.read_text(encoding="utf-8").split("\n---\n", 1)[-1]
    text = re.sub(r"```\{code-cell\}.*?\n```", " ", text, flags=re.S)
    text = re.sub(r"\{glue:[a-z]+\}`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$", " ", text, flags=re.S)
    return re.sub(r"\]\([^)]*\)", "] ", text)


def sampled_words(md, n=SAMPLE, seed=SEED) -> list[str]:
    """n distinct strings of 2-4 Chinese characters, each cut at random from a run of Chinese in the
    chapter's prose."""
    runs = [r for r in re.findall(f"[{search.CJK}]+", prose(md)) if len(r) >= 2]
    rng = random.Random(f"{seed}-{md.name}")
    words = set()
    while len(words) < n:
        run = rng.choice(runs)
        size = rng.randint(2, min(4, len(run)))
        start = rng.randrange(len(run) - size + 1)
        words.add(run[start:start + size])
    return sorted(words)


def test_sampled_words_come_from_every_chapter():
    chapters = book.chapters()
    words = {md.name: sampled_words(md) for md in chapters}
    assert len(words) == len(chapters) and sum(map(len, words.values())) >= 200
    assert all(w in prose(md) for md in chapters for w in words[md.name])


def test_search_finds_words_sampled_from_every_chapter(site, browser):
    page, errors = open_page(browser, f"{site}/search.html?q=%E6%90%9C%E7%B4%A2")
    try:
        missed, total = {}, 0
        for md in book.chapters():
            words = sampled_words(md)
            total += len(words)
            for word, docnames in search_in_page(page, words).items():
                if book.docname(md) not in docnames:
                    missed.setdefault(md.name, []).append(word)
        n_missed = sum(map(len, missed.values()))
        print(f"search: {total - n_missed} of {total} sampled words find their chapter "
              f"({(total - n_missed) / total:.1%}), from {len(book.chapters())} chapters")
        assert not missed, f"sampled words that do not find their chapter: {missed}"
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


SECTION_WORDS = ["学习率", "检查点", "验证集", "梯度累积"]


@pytest.mark.parametrize("word", SECTION_WORDS)
def test_a_hit_opens_at_the_section_that_holds_the_word(site, browser, word):
    page, errors = open_page(browser, f"{site}/search.html?q={quote(word)}")
    try:
        wait_until_searched(page)
        links = page.eval_on_selector_all("#search-results ul.search li a",
                                          "as => as.map(a => [a.href, a.dataset.section || ''])")
        with_section = [href for href, section in links if section]
        assert with_section and len(with_section) >= len(links) / 2, f"{word!r}: hits without a section: {links}"
        anchor = with_section[0].split("#", 1)[1]
        text = read_in_page(browser, with_section[0], "id => document.getElementById(decodeURIComponent(id)).innerText",
                            anchor)
        assert word in text, f"{word!r}: section #{anchor} of {with_section[0]} does not hold it"
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


# Every page the search fetches for a hit's excerpt arrives a second late: the load that once listed 2 of 7 hits
# of 验证集 with a section, made on purpose.
LATE_FETCH_JS = """const fetched = window.fetch;
window.fetch = (...args) => new Promise((done) => setTimeout(done, 1000)).then(() => fetched(...args));"""


def test_the_wait_outlasts_hit_pages_that_arrive_after_the_summary_line(site, browser):
    page = browser.new_page()
    try:
        page.add_init_script(LATE_FETCH_JS)
        goto_ready(page, f"{site}/search.html?q={quote(SECTION_WORDS[2])}")
        wait_until_searched(page)
        hits = page.eval_on_selector_all("#search-results ul.search li", "lis => lis.map(li => [!!li.querySelector("
                                         "'p.context'), li.querySelector('a').dataset.section || ''])")
        assert hits and all(excerpt for excerpt, _ in hits), f"hits listed without their excerpt: {hits}"
        assert sum(bool(section) for _, section in hits) >= len(hits) / 2, f"hits without a section: {hits}"
    finally:
        page.close()


# Words a section heading carries (the reader pass found their first hit at the page's top: the page's own
# table of contents was matched first), and a synonym the glossary gives (重计算 for the book's 重算).
FIRST_HIT_WORDS = ["续跑", "冒烟测试", "主权重", "全局批次", "分词器", "重计算"]
FIRST_HIT_JS = """() => { const a = document.querySelector('#search-results ul.search li a');
  return a && a.dataset.section ? [a.href, a.dataset.section] : null; }"""


@pytest.mark.parametrize("word", FIRST_HIT_WORDS)
def test_the_first_hit_opens_at_a_section_below_the_title(site, browser, word):
    page, errors = open_page(browser, f"{site}/search.html?q={quote(word)}")
    try:
        wait_until_searched(page)
        try:
            href, section = page.wait_for_function(FIRST_HIT_JS, timeout=15_000).json_value()
        except Exception:
            first = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")[:1]
            raise AssertionError(f"{word!r}: the first hit {first} opens at no section") from None
        term = search_terms.synonyms(GLOSSARY).get(word, word)
        top, text = read_in_page(browser, href, "id => [document.querySelector('article section[id]').id,"
                                 " document.getElementById(decodeURIComponent(id)).innerText]", section)
        assert section != top, f"{word!r}: {href} opens at the page's top section"
        assert term in text, f"{word!r}: section #{section} of {href} does not hold {term!r}"
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


# Words whose first hit must open at the section that teaches them, by its heading (the reader pass found
# 每步时间 opening chapter 2's exercises, which only use it: a glossary row now ranks the teaching page first).
TEACHING_SECTIONS = {"每步时间": ("chapters/02_1_peak", "四种配置下的一个训练步")}


def test_the_glossary_links_each_taught_word_to_its_teaching_page():
    for word, (docname, _) in TEACHING_SECTIONS.items():
        assert any(w == word and pages[0] == docname for w, pages in TERMS), f"{word}: no glossary row links {docname}"


@pytest.mark.parametrize("word", TEACHING_SECTIONS)
def test_the_first_hit_opens_at_the_section_that_teaches_the_word(site, browser, word):
    docname, heading = TEACHING_SECTIONS[word]
    page, errors = open_page(browser, f"{site}/search.html?q={quote(word)}")
    try:
        href, section = page.wait_for_function(FIRST_HIT_JS, timeout=30_000).json_value()
        assert listed_chapters([href]) == [docname], f"{word!r}: the first hit is {href}, not {docname}"
        title = read_in_page(browser, href, "id => document.getElementById(decodeURIComponent(id))"
                             ".querySelector('h1, h2, h3, h4').textContent", section)
        assert heading in title, f"{word!r}: {href} opens at #{section} ({title!r}), not at {heading!r}"
        assert not errors, f"console errors: {errors}"
    finally:
        page.close()


def test_synonyms_are_read_from_the_glossary():
    text = ("| 术语 | 英文 | 定义 | 章节 |\n|---|---|---|---|\n"
            "| 重算（也叫重计算、激活重计算） | recomputation | … | [第5章](05_accumulation.md) |\n")
    assert search_terms.synonyms(text) == {"重计算": "重算", "激活重计算": "重算"}
    assert search_terms.glossary_terms(text) == [(["重算", "重计算", "激活重计算"], ["chapters/05_accumulation"])]
    assert search_terms.synonyms(GLOSSARY).get("重计算") == "重算"
