"""The book's search: every Chinese word of two or more characters that a page contains is found, a hit
opens at the section that holds it, and the chapter that teaches a glossary term comes first.

Sphinx's Chinese search indexes jieba's segmentation of each page, and the browser looks a query up
whole, so a word jieba cuts differently in the text (学习率 into 学习 + 率, 验证集 into 验证 + 集) was never
found, however often the page used it. The index here holds, for every run of Chinese characters in
a page, each pair of neighbouring characters (NGRAM = 2), besides the Latin words Sphinx's Chinese
search keeps. The page's query splitter does the same to the query: a Chinese run of two characters
is looked up whole, a longer one as its overlapping pairs, which Sphinx's search requires all to be
on the page. So a page is found for any Chinese string of two or more characters it contains. A
longer query also matches a page that holds each of its pairs but not the string itself (学习 and 习率
apart, without 学习率): rare, and such a hit's link opens at the page's top. A single Chinese
character is not indexed (Sphinx never did) and is dropped from a query.

The size (tests/test_search_index.py prints it): jieba's words made a searchindex.js of 153 KB;
pairs make 323 KB (76 KB gzipped); pairs and triples (NGRAM = 3, fewer of those false matches)
840 KB (168 KB gzipped). The theme loads the index on every page, so pairs it is.

Then two things in the browser (SEARCH_JS, loaded with Sphinx's language data on the search page):

- Scorer.score puts first the chapters the glossary links a term to (chapters/glossary.md's last
  column, in its order: search_terms.glossary_terms), when the query is that term.
- Each hit's link and excerpt go to the section of the page that holds the query: the first section
  below the page's title whose heading holds it, else the one around its first mention below the
  title (bookSection). Sphinx fetches each hit's page for its excerpt anyway, and the section is found
  in it. Only the article is read: the page's own tables of contents hold every heading, and when they
  were read too they matched first, so 15 of 24 first hits opened at the page's top.
- A synonym the glossary gives for a term (重计算 for 重算: search_terms.synonyms) is searched as the term.

tests/test_search_index.py measures the index and samples words from every chapter;
tests/test_search_terms.py searches every glossary term in the built book.
"""
import hashlib
import json
import re
from pathlib import Path

from sphinx.search.zh import SearchChinese

from .search_terms import GLOSSARY, glossary_terms, synonyms

NGRAM = 2  # longest Chinese substring indexed; a longer query is looked up as its pieces of this length
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUN = re.compile(f"[{CJK}]+")


def ngrams(text: str, longest: int = NGRAM) -> list[str]:
    """Every substring of 2..longest characters of each run of Chinese characters in text."""
    grams = []
    for run in _RUN.findall(text):
        for n in range(2, longest + 1):
            grams.extend(run[i:i + n] for i in range(len(run) - n + 1))
    return grams


def query_terms(query: str, longest: int = NGRAM) -> list[str]:
    """What the page's splitQuery (SEARCH_JS) makes of a query's Chinese runs, in Python, for the tests:
    a run of 2..longest characters whole, a longer run as its overlapping pieces of `longest`."""
    terms = []
    for run in _RUN.findall(query):
        if len(run) < 2:
            continue
        terms.extend([run] if len(run) <= longest else [run[i:i + longest] for i in range(len(run) - longest + 1)])
    return terms


class SearchBook(SearchChinese):
    """Sphinx's Chinese search, with the n-grams of the text in place of jieba's words."""

    def init(self, options) -> None:
        self.stemmer = __import__("snowballstemmer").stemmer("english")  # SearchChinese.init without jieba

    def split(self, input: str) -> list[str]:
        latin = [t.strip() for t in self.latin1_letters.findall(input)]
        self.latin_terms.extend(latin)
        return ngrams(input) + latin


SEARCH_JS = r"""
/* bookbuild/search.py: the book's query splitter, the teaching chapter first, hits open at their section. */
var BOOK_NGRAM = %(ngram)d;
var BOOK_TEACHES = %(teaches)s;
var BOOK_SYNONYMS = %(synonyms)s;
var splitQuery = (query) => {
  const terms = [];
  for (const word of query.split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu)) {
    for (const piece of word.split(/([%(cjk)s]+)/u)) {
      if (!piece) continue;
      if (!/^[%(cjk)s]+$/u.test(piece)) { terms.push(piece); continue; }
      if (piece.length < 2) continue;  // a single Chinese character is not indexed
      if (piece.length <= BOOK_NGRAM) terms.push(piece);
      else for (let i = 0; i + BOOK_NGRAM <= piece.length; i++) terms.push(piece.substr(i, BOOK_NGRAM));
    }
  }
  return terms;
};
var bookNormal = (text) => (text || "").toLowerCase().replace(/\s+/g, " ").trim();
if (typeof Scorer !== "undefined") {
  Scorer.score = (result) => {
    const [docname, , , , score] = result;
    const teaches = BOOK_TEACHES[bookNormal(Search._bookQuery)] || [];
    const rank = teaches.indexOf(docname);
    return rank >= 0 ? score + 1000 * (teaches.length - rank) : score;  // above any title or term score
  };
}
/* The section a hit opens at: the first section below the page's title whose heading holds the query;
   else the innermost section below the title around its first mention there; else none (the page's top).
   Only the article is read: the page's own tables of contents (the sidebar's, the print one) hold every
   heading, and were matched first. Text is compared lower case, runs of white space as one. */
var bookSection = (root, query) => {
  const article = root.querySelector("article") || root;
  const sections = [...article.querySelectorAll("section[id]")];
  if (!query || !sections.length) return null;
  const top = sections[0];
  const below = sections.filter((s) => s !== top && top.contains(s));
  const heading = (s) => {
    const h = s.querySelector(":scope > h1, :scope > h2, :scope > h3, :scope > h4, :scope > h5, :scope > h6");
    if (!h) return "";
    return bookNormal([...h.childNodes].filter((n) => !(n.classList && n.classList.contains("headerlink")))
      .map((n) => n.textContent).join(""));
  };
  const titled = below.find((s) => heading(s).includes(query));
  if (titled) return titled;
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  let flat = "";
  const owner = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && n.parentElement.closest("script, style, .headerlink")) continue;
    const value = n.nodeValue.toLowerCase();
    for (let i = 0; i < value.length; i++) {
      let ch = value[i];
      if (/\s/.test(ch)) { if (flat === "" || flat.endsWith(" ")) continue; ch = " "; }
      flat += ch;
      owner.push(n);
    }
  }
  for (let at = flat.indexOf(query); at >= 0; at = flat.indexOf(query, at + 1)) {
    const section = owner[at].parentElement.closest("section[id]");
    if (section && below.includes(section)) return section;
  }
  return null;
};
/* The glossary's synonyms (（也叫 …）, search_terms.synonyms) become the term the book writes. */
var bookCanonical = (query) => Object.keys(BOOK_SYNONYMS).sort((a, b) => b.length - a.length)
  .reduce((q, word) => q.split(word).join(BOOK_SYNONYMS[word]), query || "");
/* An excerpt reads math as text: the page's TeX (\(T^*\), \[B_\text{global} = …\]) without its
   delimiters, its \text{} and \frac{}{} unwrapped and its commands as the symbols they print. */
var BOOK_TEX_SYMBOLS = {times: "×", cdot: "·", approx: "≈", le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠",
  neq: "≠", pm: "±", to: "→", rightarrow: "→", Longrightarrow: "⟹", infty: "∞", propto: "∝", in: "∈",
  sum: "Σ", sqrt: "√", partial: "∂", nabla: "∇", odot: "⊙", top: "ᵀ", ell: "ℓ", dots: "…", ldots: "…",
  cdots: "⋯", lfloor: "⌊", rfloor: "⌋", alpha: "α", beta: "β", gamma: "γ", delta: "δ", Delta: "Δ",
  epsilon: "ε", eta: "η", theta: "θ", lambda: "λ", mu: "μ", pi: "π", sigma: "σ", tau: "τ", bmod: "mod",
  quad: " ", qquad: " ", " ": " ", ",": " ", ";": " ", ":": " ", "!": "", left: "", right: "", big: "", Big: "",
  bigl: "", bigr: "", displaystyle: ""};
var bookGroup = (x) => /[-+ ]/.test(x.trim()) ? `(${x.trim()})` : x.trim();  // (G-1)/G, not G-1/G
var BOOK_TEX_WRAPPERS = new RegExp("\\\\(?:text|textrm|mathrm|mathbf|mathit|mathcal|operatorname|boldsymbol"
                                   + "|bar|hat|underbrace)\\s*\\{([^{}]*)\\}", "g");
var bookPlainTex = (tex) => {
  let t = tex;
  for (let i = 0; i < 4; i++)  // inside out: a \frac of \text{}s
    t = t.replace(BOOK_TEX_WRAPPERS, "$1")
         .replace(/\\t?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, (m, a, b) => `${bookGroup(a)}/${bookGroup(b)}`);
  t = t.replace(/\\([A-Za-z]+|[,;:! %%$#&_])/g, (m, name) => name in BOOK_TEX_SYMBOLS ? BOOK_TEX_SYMBOLS[name] : name);
  return t.replace(/[{}]/g, "").replace(/\s+/g, " ").trim();
};
var bookPlainMath = (text) => text
  .replace(/\\\(([\s\S]*?)\\\)/g, (m, tex) => bookPlainTex(tex))
  .replace(/\\\[([\s\S]*?)\\\]/g, (m, tex) => bookPlainTex(tex))
  .replace(/\$\$([\s\S]*?)\$\$/g, (m, tex) => bookPlainTex(tex));
if (typeof Search !== "undefined") {
  const sphinxHtmlToText = Search.htmlToText;  // the text makeSearchSummary cuts an excerpt from
  Search.htmlToText = (htmlString, anchor) => bookPlainMath(sphinxHtmlToText(htmlString, anchor));
  const sphinxParseQuery = Search._parseQuery;
  Search._parseQuery = (query) => {
    query = bookCanonical(query);
    Search._bookQuery = query;
    return sphinxParseQuery(query);
  };
  const sphinxSummary = Search.makeSearchSummary;
  Search.makeSearchSummary = (htmlText, keywords, anchor) => {
    const page = new DOMParser().parseFromString(htmlText, "text/html");
    const main = page.querySelector('[role="main"]');
    const section = main ? bookSection(main, bookNormal(Search._bookQuery)) : null;  // before a title's anchor
    const summary = sphinxSummary(htmlText, keywords, section ? "#" + CSS.escape(section.id) : anchor);
    if (section && summary) queueMicrotask(() => {  // the summary is in its list item by now
      const link = summary.parentElement && summary.parentElement.querySelector("a");
      if (link) { link.href = link.href.split("#")[0] + "#" + section.id; link.dataset.section = section.id; }
    });
    return summary;
  };
}
"""


def teaches(srcdir: Path) -> dict[str, list[str]]:
    """Each glossary word (lower case) -> the chapters the glossary links it to, in its order."""
    text = (Path(srcdir) / GLOSSARY).read_text(encoding="utf-8")
    found = {}
    for words, pages in glossary_terms(text):
        for word in words:
            found.setdefault(" ".join(word.lower().split()), pages)
    return found


def search_js(srcdir: Path) -> str:
    path = Path(srcdir) / GLOSSARY
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    return SEARCH_JS % {"ngram": NGRAM, "cjk": CJK,
                        "teaches": json.dumps(teaches(srcdir) if text else {}, ensure_ascii=False, sort_keys=True),
                        "synonyms": json.dumps(synonyms(text), ensure_ascii=False, sort_keys=True)}


def use_book_search(app, config) -> None:
    """config-inited: the n-gram index (SearchBook) for the book's Chinese, and SEARCH_JS as Sphinx's
    search scorer (html_search_scorer: a file, named by its content's hash so that a changed glossary
    is a changed configuration; an absolute path, since Sphinx opens it relative to the working
    directory)."""
    from sphinx import search as sphinx_search
    sphinx_search.languages["zh"] = SearchBook
    js = search_js(app.srcdir)
    # Sphinx re-reads every page when html_search_options change, but keeps the words of the index it
    # loads from the last build (emptied of pages, still written out): a changed index scheme starts
    # from no index at all.
    scheme = hashlib.sha256((Path(__file__).read_text(encoding="utf-8")).encode()).hexdigest()[:12]
    config.html_search_options = {**(config.html_search_options or {}), "book_index": scheme}
    stamp = Path(app.outdir) / ".book-search-scheme"
    if not stamp.is_file() or stamp.read_text() != scheme:
        (Path(app.outdir) / "searchindex.js").unlink(missing_ok=True)
        Path(app.outdir).mkdir(parents=True, exist_ok=True)
        stamp.write_text(scheme)
    path = Path(app.doctreedir).parent / "search" / f"book-search-{hashlib.sha256(js.encode()).hexdigest()[:12]}.js"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(js, encoding="utf-8")
    config.html_search_scorer = str(path.resolve())
