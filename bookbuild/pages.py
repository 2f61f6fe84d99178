"""How the built pages read in Chinese: quotation marks, figure numbers and the show/hide prompts.

- Quotation marks. docutils' "smart quotes" decide between an opening and a closing quote by the
  character before it; a CJK character counts as neither space nor punctuation, so "计算最优" came out
  as ”计算最优” (two closing quotes), and the same pass turned a glued "+--+" (four residual signs) into
  "+–+". _config.yml turns smart quotes off (`smartquotes: false`); pair_quotes then turns each pair
  of ASCII double quotes in running text into “…”, in order, in a paragraph that holds an even number
  of them. Code, math, and every literal block (the cells' source and outputs) are left as they are;
  dashes and "..." are never touched.
- Figure numbers. Sphinx numbers figures across the whole book unless the table of contents is
  numbered (the book's titles carry their own 第N章), so chapter 7's first figure was 图 2.
  number_figures_by_chapter renumbers them per chapter: 图 6.1, 图 6.2, ... in reading order. Sphinx
  numbers only figure nodes, and myst-nb makes one only for a cell with `mystnb: figure:` metadata, so
  the figures of a cell without it (chapters 2-4's) had no number: FigureEveryImage wraps each image a
  cell prints that is in no figure in one, with a caption of one no-break space (Sphinx skips a figure
  whose caption is empty) that carries the number; the text under the cell describes it, as before.
  A caption in the cell's metadata is still the better place.
- Printed tables. book.css wraps the cells' outputs at the column (nothing scrolls sideways), which broke
  a table printed with aligned columns into lines that no longer line up. MarkColumns gives an output
  whose lines are such a table (table_like) the class book-columns, and _static/layout.css keeps its
  lines whole: it scrolls sideways instead.
- The prompts of a cell whose source is hidden (`hide-input`): myst-nb writes "Show code cell
  source" / "Hide code cell source"; _config.yml gives the Chinese prompt with myst-nb's {type}
  placeholder, and translate_prompts puts the Chinese word for the type in. The theme's search box
  says "Search this book..." unless told otherwise (chinese_search_box; html_theme_options is set
  here, since a value of it in _config.yml's sphinx.config would replace the theme options Jupyter
  Book derives from its html: section).
- The theme's other words: under `language: zh_CN` the footer still said "© Copyright 2026." and the
  tooltips "Color mode", "Link to this heading", "Launch on Colab" (Sphinx's and the themes' zh catalogs
  lack them). UI_MESSAGES gives them in Chinese, looked up before each catalog (chinese_ui_messages); the
  two sidebar buttons, whose tooltips are no message, come from bookbuild/templates/ (chinese_templates).

tests/test_pages.py checks each of these on the built pages, in headless Chromium.
"""
import gettext
import re
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform

from . import book

OPEN, CLOSE = "\u201c", "\u201d"
_NO_QUOTES = (nodes.FixedTextElement, nodes.literal, nodes.math, nodes.math_block, nodes.raw,
              nodes.comment, nodes.target)


def pair_quote_texts(texts: list[str]) -> list[str]:
    """The pieces of one paragraph's running text with its ASCII double quotes paired as “…”. A
    paragraph with an odd number of them (a quote that opens here and closes elsewhere, or an inch
    sign) keeps them all, rather than pairing the wrong ones."""
    if sum(t.count('"') for t in texts) % 2:
        return texts
    out, opening = [], True
    for text in texts:
        pieces = text.split('"')
        joined = pieces[0]
        for piece in pieces[1:]:
            joined += (OPEN if opening else CLOSE) + piece
            opening = not opening
        out.append(joined)
    return out


def _running_text(element: nodes.Element) -> list[nodes.Text]:
    found = []
    for child in element.children:
        if isinstance(child, nodes.Text):
            found.append(child)
        elif isinstance(child, nodes.Element) and not isinstance(child, (*_NO_QUOTES, nodes.paragraph)):
            found.extend(_running_text(child))
    return found


class PairQuotes(SphinxTransform):
    """ASCII double quotes in running text become “…” (see the module's docstring)."""

    default_priority = 760  # after the glued values are in the page, where smart quotes would run

    def apply(self, **kwargs) -> None:
        for element in self.document.findall(nodes.TextElement):
            if isinstance(element, _NO_QUOTES) or any(isinstance(a, _NO_QUOTES) for a in _ancestors(element)):
                continue
            if isinstance(element.parent, nodes.TextElement) and not isinstance(element.parent, _NO_QUOTES):
                continue  # an inline element: its text is paired with its paragraph's
            texts = _running_text(element)
            if not any('"' in t for t in texts):
                continue
            for old, new in zip(texts, pair_quote_texts([str(t) for t in texts])):
                if new != str(old):
                    old.parent.replace(old, nodes.Text(new))


class FigureEveryImage(SphinxTransform):
    """Each image a code cell prints, outside any figure, becomes a numbered figure (see the docstring)."""

    default_priority = 500  # as the page is read: Sphinx numbers figures from the stored doctree

    def apply(self, **kwargs) -> None:
        bundles = [n for n in self.document.findall(nodes.container)
                   if n.get("nb_element") == "mime_bundle"
                   and any(str(c.get("mime_type", "")).startswith("image/") for c in n.children)
                   and not any(isinstance(a, nodes.figure) for a in _ancestors(n))]
        for bundle in bundles:
            figure = nodes.figure("", classes=["book-numbered"])
            bundle.replace_self(figure)
            figure += bundle
            figure += nodes.caption("", "\u200b")  # Sphinx numbers no figure whose caption is empty
            self.document.set_id(figure)


COLUMN_GAP = re.compile(r" {2,}| ?\| ?")  # what separates a printed table's columns: 2+ spaces or a bar


def table_like(text: str) -> bool:
    """Whether printed text is a table: at least three of its lines, and half or more of them, have a
    column gap (two or more spaces, or a bar) that starts or ends at the same position."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 3:
        return False
    seen = {}
    for line in lines:
        edges = {e for m in COLUMN_GAP.finditer(line.rstrip()) if m.start() > 0 for e in (m.start(), m.end())}
        for e in edges:
            seen[e] = seen.get(e, 0) + 1
    return max(seen.values(), default=0) >= max(3, len(lines) / 2)


class MarkColumns(SphinxTransform):
    """A cell's printed output that is a table (table_like) gets the class book-columns (layout.css)."""

    default_priority = 500

    def apply(self, **kwargs) -> None:
        for block in self.document.findall(nodes.literal_block):
            if any("cell_output" in a.get("classes", []) for a in _ancestors(block)) and table_like(block.astext()):
                block["classes"].append("book-columns")


def _ancestors(node):
    node = node.parent
    while node is not None:
        yield node
        node = node.parent


def number_figures_by_chapter(app, env) -> list[str]:
    """env-get-updated, after Sphinx numbered the figures across the book: number them per chapter,
    (chapter, n), which Sphinx writes as 图 6.1, counting on across a chapter's section pages in reading
    order (its section page's first figure after 图 9.3 is 图 9.4). Pages that are not chapters keep theirs."""
    counted: dict[tuple[int, str], int] = {}
    for md in book.chapters():  # reading order
        docname, number = book.docname(md), book.chapter_number(md)
        by_type = env.toc_fignumbers.get(docname)
        if not by_type:
            continue
        for figtype, ids in by_type.items():
            in_order = sorted(ids, key=lambda i: ids[i])
            start = counted.get((number, figtype), 0)
            by_type[figtype] = {i: (number, start + k) for k, i in enumerate(in_order, start=1)}
            counted[(number, figtype)] = start + len(in_order)
    return []


PROMPT_TYPES = {"content": "这一格", "source": "代码", "output": "输出", "outputs": "输出"}


def translate_prompt(prompt: str) -> str:
    """myst-nb's prompt after it put the English type in ("显示source") -> "显示代码"."""
    for english in sorted(PROMPT_TYPES, key=len, reverse=True):  # "outputs" before "output"
        if prompt.endswith(english):
            return prompt[: -len(english)] + PROMPT_TYPES[english]
    return prompt


class TranslatePrompts(SphinxPostTransform):
    """The hidden cell's show/hide prompts, with the type of what they hide in Chinese."""

    default_priority = 200  # just after myst-nb's HideInputCells (199) made them
    formats = ("html",)

    def run(self, **kwargs) -> None:
        from myst_nb.sphinx_ import HideCodeCellNode
        for node in self.document.findall(HideCodeCellNode):
            for key in ("prompt_show", "prompt_hide"):
                node[key] = translate_prompt(node[key])


SEARCH_BOX = "搜索本书…"

# What the themes and Sphinx still say in English under `language: zh_CN` (their zh catalogs lack these, or
# "translate" the footer's copyright as itself), by message catalog: Sphinx's own with the themes', and
# sphinx-book-theme's.
UI_MESSAGES = {
    "sphinx": {
        "© Copyright %(copyright)s.": "版权所有 © %(copyright)s",
        "Link to this heading": "链接到本节", "Link to this image": "链接到此图", "Link to this table": "链接到此表",
        "Link to this equation": "链接到此公式", "Link to this code": "链接到此代码",
        "Link to this definition": "链接到此定义", "Link to this term": "链接到此术语",
        "Color mode": "配色", "System Settings": "跟随系统",
    },
    "booktheme": {"Launch on": "启动于", "Launch interactive content": "在线运行"},
}


class ChineseFirst(gettext.NullTranslations):
    """A message catalog's translator, with UI_MESSAGES looked up before it."""

    def __init__(self, messages: dict, translator) -> None:
        super().__init__()
        self.messages = messages
        if translator is not None:
            self.add_fallback(translator)

    def gettext(self, message):
        return self.messages.get(message) or super().gettext(message)


TEMPLATES = Path(__file__).parent / "templates"  # the theme's components whose English is no message


def chinese_templates(app, config) -> None:
    """config-inited: TEMPLATES before the themes' own components (they append theirs to templates_path)."""
    config.templates_path = [str(TEMPLATES), *(config.templates_path or [])]


def chinese_ui_messages(app, config) -> None:
    """config-inited, before the builder installs app.translator in its templates: each catalog's translator
    looks in UI_MESSAGES first (sphinx.locale's `_` and the templates' `_()` both use it)."""
    from sphinx import locale
    for catalog, messages in UI_MESSAGES.items():
        key = ("general", catalog)
        translator = ChineseFirst(messages, locale.translators.get(key))
        locale.translators[key] = translator
        if catalog == "sphinx":
            app.translator = translator


def chinese_search_box(app, config) -> None:
    config.html_theme_options = {**(config.html_theme_options or {}), "search_bar_text": SEARCH_BOX}


def simplified_print_label(app, pagename, templatename, context, doctree) -> None:
    """sphinx-book-theme's zh_CN catalog labels its print button 列印成 PDF, Traditional usage: 打印."""
    def simplified(x):
        if isinstance(x, str):
            return x.replace("列印", "打印")
        if isinstance(x, list):
            return [simplified(i) for i in x]
        return {k: simplified(v) for k, v in x.items()} if isinstance(x, dict) else x
    if "header_buttons" in context:
        context["header_buttons"] = simplified(context["header_buttons"])


def setup(app) -> None:
    app.connect("config-inited", chinese_search_box)
    app.connect("config-inited", chinese_ui_messages)
    app.connect("config-inited", chinese_templates)
    app.connect("html-page-context", simplified_print_label, priority=900)  # after the theme made its buttons
    app.add_transform(PairQuotes)
    app.add_transform(FigureEveryImage)
    app.add_transform(MarkColumns)
    app.add_post_transform(TranslatePrompts)
    app.connect("env-get-updated", number_figures_by_chapter, priority=900)  # after Sphinx's own numbering
