"""The provenance page (chapters/provenance.md): where each chapter's numbers come from.

For each chapter: how its outputs were produced (executed by this build, or taken from the execution
cache, where an earlier build or nbval put them), when (the cache record's time), how long it took, on
what machine (the chapter's own experiment record, the `print_record()` cell at its end), for a
chapter with cells tagged `cuda`, whether those show a GPU run and which, and the record's tightest
asserts on measured values; and, for the reference outputs stored in the repository (the .ipynb the
tests compare against), how fast a training step ran when they were made against this CPU's quiet figure
(quiet.py), so a reader sees which pages were made on a busy machine. All of it is said for a reader,
in plain Chinese (row_cells; no tool or cache names: "taken from the cache" reads 沿用, nbval reads 运行本书的测试).

The page holds the directive
    ```{provenance-table}
    ```
which leaves a placeholder. The table can only be made once every chapter is read and executed, so
the page is written again on every build (env-updated) and the placeholder is replaced when the page
is written (doctree-resolved). myst-nb's own execution statistics (`{nb-exec-table}`) say "cache" for
both a fresh execution and a cache hit; the cache record says which.

Every chapter page also says, on its first screen (a sentence after the first paragraph under its
title), how long the chapter took to execute from top to bottom and on which CPU, from the same data,
with a link to this page: a reader sees at once what running it will cost, and that it will differ.
"""
import datetime
import os
import platform
import re
import sys

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from . import book, cache, cuda, quiet

FLAG = "has_provenance_table"  # set in myst-nb's per-document metadata, which handles purge and merge
RECORD_CALL = "print_record()"  # the last line of a chapter's last cell: code/measure.py prints "key: value" lines
RECORD_LINE = re.compile(r"^ *([^:\n]+): (.*)$")
MACHINE_KEYS = ("CPU", "CPU cores", "python", "torch")  # what says which machine and software ran it
TIME_FORMAT = "%Y-%m-%d %H:%M UTC"
RUNTIME_CLASS = "chapter-runtime"  # the class of the sentence at the top of each chapter's page

# how a chapter's outputs came to be on the page, said for a reader: an output taken from the execution cache
# is used only while the chapter's code and inputs are unchanged (bookbuild/cache.py), and nbval stores a
# chapter there only when its outputs matched the stored reference outputs (bookbuild/nbval_hooks.py)
HOW = {
    "build": "这次构建时执行",
    "earlier build": "沿用较早一次构建时的执行（此后本章的代码和输入都没变）",
    "nbval": "沿用运行本书测试时的执行：测试把它的输出与仓库里存的参考输出逐格核对过（随机器而变的数字除外），"
             "此后本章的代码和输入都没变",
    "not executed": "没有执行，页面上没有它的输出",
    "failed": "执行失败，页面上没有它的输出",
}


# ---- what the page says, from plain data (tested in tests/test_provenance.py) ----

def parse_record(text: str) -> dict:
    """The experiment record (measure.print_record) at the end of a cell's printed text, as {key: value}
    strings: the run of "key: value" lines that ends the text."""
    record = {}
    for line in reversed(text.rstrip("\n").splitlines()):
        match = RECORD_LINE.fullmatch(line)
        if not match:
            break
        record[match.group(1).strip()] = match.group(2).strip()
    return dict(reversed(record.items()))


def record_of(nb) -> dict:
    """The experiment record in an executed chapter's outputs ({} if it has none): the printed text of
    the last code cell whose last line calls print_record()."""
    for cell in reversed(nb.cells):
        if cell.cell_type == "code" and cell.source.strip().splitlines()[-1:] == [RECORD_CALL]:
            return parse_record("".join(out.get("text", "") for out in cell.get("outputs", [])
                                        if out.get("output_type") == "stream"))
    return {}


def how_executed(created: datetime.datetime | None, executed_by: str | None,
                 build_started: datetime.datetime, succeeded: bool | None = True) -> str:
    """A key of HOW. created: when the execution was stored in the cache (UTC; None: not in it)."""
    if succeeded is False:
        return "failed"
    if created is None:
        return "not executed"
    if executed_by == "nbval":
        return "nbval"
    return "build" if created >= build_started else "earlier build"


def same_machine(record: dict, build_machine: dict) -> bool:
    """Whether a chapter's record names this build's machine: CPU, cores, Python, torch and kernels."""
    return all(record.get(k) == build_machine.get(k) for k in MACHINE_KEYS + ("ISA",) if k in record)


def machine_text(record: dict, build_machine: dict) -> str:
    """The machine a chapter ran on: 'the machine that built this edition' when its record matches it."""
    if not record:
        return "（本章没有实验记录）"
    kernels = (f"，{record['ISA']}" if record.get("ISA") else "") + (
        f"，{record['torch threads']} 个线程" if record.get("torch threads") else "")
    if same_machine(record, build_machine):
        return "构建这一版的机器" + kernels
    return (f"{record.get('CPU', '?')}，{record.get('CPU cores', '?')} 核，"
            f"Python {record.get('python', '?')}，torch {record.get('torch', '?')}" + kernels)


def cuda_text(has_cuda_cells: bool, stored: dict | None) -> str:
    """What the page says about a chapter's cells tagged `cuda` ('' for a chapter without them): the
    build never executes them (cuda.py), so they show a stored GPU run or nothing."""
    if not has_cuda_cells:
        return ""
    if stored:
        return (f"要 GPU 的几格构建时不执行，显示的是存档的一次 GPU 运行的输出（{stored.get('gpu', '?')}，"
                f"{stored.get('date', '?')}，提交 {stored.get('commit', '?')}）。")
    return "要 GPU 的几格构建时不执行，也还没有存档的 GPU 运行，它们下面没有输出。"


def how_text(how: str, has_cuda_cells: bool, stored: dict | None) -> str:
    """How a chapter's outputs came to be on the page (HOW), and where its cells tagged `cuda` ran."""
    return HOW[how] + "。" + cuda_text(has_cuda_cells, stored)


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
MARGIN_ENTRY = re.compile(r"(?P<name>.+) (?P<margin>×\S+|[+-]\S+) \((?P<value>\S+) (?P<op>[<>]) (?P<bound>\S+)\)")


def number_text(text: str) -> str:
    """A number as print_record wrote it (Python's .3g), in the book's prose notation: 1.26e+08 -> 1.26 × 10⁸."""
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa} × 10{str(int(exponent)).translate(SUPERSCRIPT)}" if e and exponent else text


def margins_text(record_margins: str | None) -> list[str]:
    """The record's tightest asserts on measured values (measure.margins_text's 'name ×1.26 (1.07 < 1.35); ...'),
    one Chinese sentence each: the claim as the chapter's code names it, the value measured, its bound and how far
    it was from it. An entry that does not read as one is shown as it is."""
    if not record_margins:
        return ["本章没有对量出来的数字下断言。"]
    said = []
    for entry in record_margins.split("; "):
        m = MARGIN_ENTRY.fullmatch(entry.strip())
        if not m:
            said.append(entry)
            continue
        value, bound, margin = number_text(m["value"]), number_text(m["bound"]), m["margin"]
        below = m["op"] == "<"
        if margin.startswith("×"):
            far = (f"界限是测得值的 {margin[1:]} 倍" if below else f"测得值是界限的 {margin[1:]} 倍")
        else:
            far = f"{'低' if below else '高'}出界限 {number_text(margin.lstrip('+'))}"
        said.append(f"「{m['name']}」：测得 {value}，应{'小于' if below else '大于'} {bound}，{far}。")
    return said


def where_text(row: dict) -> str:
    return row["machine"] + (f"；代码提交 {row['commit']}" if row["commit"] else "")


def common_case(rows: list) -> tuple[str, str]:
    """(where the outputs come from, where and at which commit they ran) for most pages: said once above
    the table, so that a row shows only how its page differs."""
    def most(values):
        values = list(values)
        return max(values, key=values.count) if values else ""
    return most(r["how_text"] for r in rows), most(where_text(r) for r in rows)


def row_cells(row: dict, common: tuple[str, str] = ("", "")) -> list:
    """The provenance table's cells for one chapter after its title (ROW_HEADER), from chapter_rows' row;
    the last cell says only where the row differs from `common` (common_case), else a dash."""
    when = row["when"] or "没有执行"
    took = "用时没有记录" if row["seconds"] is None else f"用了 {duration_text(row['seconds'])}"
    differs = [text for text, usual in ((row["how_text"], common[0]), (where_text(row), common[1])) if text != usual]
    return [f"{when}，{took}", row["margins"], row["reference"], differs or "—"]


ROW_HEADER = ["页面", "何时执行、用了多久", "离界限最近的断言", "仓库里的参考输出存下时机器多忙",
              "与表上那段话不同之处"]


def duration_text(seconds: float) -> str:
    """Seconds in Chinese, to the second: 192.4 -> '3 分 12 秒', 3720 -> '1 小时 2 分'."""
    whole = round(seconds)
    if whole < 1:
        return "不到 1 秒"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} 小时"] * bool(hours) + [f"{minutes} 分"] * bool(minutes) + [f"{secs} 秒"] * bool(secs)
    return " ".join(parts)


def runtime_sentence(how: str, seconds: float | None, record: dict, build_machine: dict, link: str | None,
                     unit: str = "本章") -> str:
    """The sentence at the top of a chapter's page: how long the chapter took to execute from top to
    bottom, and on which CPU. how: a key of HOW; record: the chapter's experiment record; link: the
    provenance page's title, which the page turns into a link to it (None: no such page); unit: 本章, or
    本节 on a chapter's section page (section_unit)."""
    see = f"见{link}。" if link else ""
    if how in ("failed", "not executed"):
        done = f"{unit}执行失败" if how == "failed" else f"没有执行{unit}"
        return f"构建本书时{done}，页面上没有它的输出" + (f"；{see}" if see else "。")
    cpu = f"{record.get('CPU', '?')}，{record.get('CPU cores', '?')} 核"
    took = f"从头到尾执行用了 {duration_text(seconds)}" if seconds is not None else "执行用时没有记录"
    if not record:
        where = f"{unit}的输出来自一次没有留下实验记录的执行，"
    elif same_machine(record, build_machine):
        where = f"在构建本书的机器上（{cpu}），{unit}"
    else:
        where = f"本页的输出来自另一台机器（{cpu}）上的一次执行，{unit}在那里"
    return f"{where}{took}；你的机器上会不同" + (f"，{see}" if see else "。")


def build_machine() -> dict:
    """This build's machine, in the chapters' record format (code/record.py), and its OS."""
    sys.path.insert(0, str(book.REPO / "code"))
    try:
        import record
        rec = {k: str(v) for k, v in record.experiment_record().items()}
    except ImportError:  # a book built without its code/ (a test's two-page copy): what the platform says
        rec = {"CPU": platform.processor() or platform.machine(), "CPU cores": str(os.cpu_count())}
    finally:
        sys.path.remove(str(book.REPO / "code"))
    try:
        rec["OS"] = platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError):
        rec["OS"] = platform.platform()
    return rec


# ---- gathering it in a build ----

def chapter_rows(env, build_started: datetime.datetime) -> tuple[list[dict], dict]:
    """One dict per chapter, in _toc.yml's order, from myst-nb's execution data and the cache; and
    this build's machine."""
    from jupyter_cache import get_cache
    from myst_nb.sphinx_ import NbMetadataCollector

    store = get_cache(str(cache.CACHE))  # read only: bookbuild.cache.execution_cache may empty it
    machine = build_machine()
    calibrations = quiet.stored_calibrations()  # the reference outputs' own calibration lines
    rows = []
    for md in book.chapters():
        docname = book.docname(md)
        exec_data = NbMetadataCollector.get_doc_data(env).get(docname, {}).get("exec_data")
        nb_read = cache.as_the_build_reads(md)
        created, executed_by, seconds, record = None, None, None, {}
        if exec_data:
            try:
                hit = store.match_cache_notebook(nb_read)
            except KeyError:
                hit = None
            if hit is not None:
                created = hit.created.replace(tzinfo=datetime.timezone.utc)  # jupyter-cache stores UTC
                executed_by = hit.data.get("executed_by")
                seconds = hit.data.get("execution_seconds")
                record = record_of(store.get_cache_bundle(hit.pk).nb)
            else:  # executed, but not through the cache: myst-nb's own statistics
                created = datetime.datetime.fromtimestamp(exec_data["mtime"], datetime.timezone.utc)
            seconds = seconds if seconds is not None else exec_data.get("runtime")
        how = how_executed(created, executed_by, build_started, exec_data.get("succeeded") if exec_data else None)
        has_cuda_cells = any(cuda.is_cuda_cell(c) for c in nb_read.cells)
        stored = cuda.stored_gpu_run(md) if has_cuda_cells else None
        rows.append({
            "docname": docname, "title": book.title(md),
            "when": created.strftime(TIME_FORMAT) if created else None,
            "seconds": seconds,
            "commit": record.get("git commit"),
            "machine": machine_text(record, machine),
            "how_text": how_text(how, has_cuda_cells, stored),
            "margins": margins_text(record.get("margins")),  # measure.check's tightest asserts, said in Chinese
            "reference": quiet.calibration_text(md.stem, calibrations),
            "run": {"how": how, "seconds": seconds, "record": record},  # for the chapter page's own sentence
        })
    return rows, machine


# ---- Sphinx ----

class ProvenanceNode(nodes.General, nodes.Element):
    """Where the provenance table goes, once every chapter has been executed."""


class ProvenanceTable(SphinxDirective):
    def run(self):
        from myst_nb.sphinx_ import NbMetadataCollector
        NbMetadataCollector.set_doc_data(self.env, self.env.docname, FLAG, True)
        return [ProvenanceNode()]


def note_build_start(app):
    app.provenance_build_started = datetime.datetime.now(datetime.timezone.utc)
    app.provenance_rows = None  # chapter_rows, made once per build when the first page needs them


def rows_of_this_build(app) -> tuple[list[dict], dict]:
    """chapter_rows for this build, made once: the pages are written after every chapter was executed."""
    if app.provenance_rows is None:
        app.provenance_rows = chapter_rows(app.env, app.provenance_build_started)
    return app.provenance_rows


def pages_with_the_table(app, env):
    """env-updated: write the provenance page on every build, after all chapters are read."""
    from myst_nb.sphinx_ import NbMetadataCollector
    return [doc for doc, data in NbMetadataCollector.get_doc_data(env).items() if data.get(FLAG)]


def fill_table(app, doctree, docname):
    """doctree-resolved: replace the placeholder with the machine paragraph and the table."""
    placeholders = list(doctree.findall(ProvenanceNode))
    if not placeholders:
        return
    rows, machine = rows_of_this_build(app)
    this = "这份 PDF（python -m bookbuild.pdf）" if app.builder.format == "latex" else "这一版"
    built = nodes.paragraph(text=(
        f"{this}构建于 {app.provenance_build_started.strftime(TIME_FORMAT)}，构建机器：{machine.get('CPU')}，"
        f"{machine.get('CPU cores')} 核，{machine.get('ISA')}，{machine.get('OS')}，Python {machine.get('python')}，"
        f"torch {machine.get('torch')}" + (f"，{machine['GPU']}" if machine.get("GPU") else "，没有 GPU")
        + f"；代码提交 {machine.get('git commit')}。"))
    how, where = common_case(rows)
    usual = nodes.paragraph(text=f"下表每一页，除非最后一列另有说明：{how.rstrip('。')}。它在{where}。")
    table = _table(ROW_HEADER, [[_link(app, docname, r["docname"], r["title"]), *row_cells(r, (how, where))]
                                for r in rows])
    for node in placeholders:
        node.replace_self([built, usual, table])


def insert_after_first_paragraph(doctree, paragraph) -> None:
    """Put `paragraph` after the first paragraph under the page's title (in its level-1 section, before
    any subsection); right below the title if no paragraph comes before the first subsection."""
    section = next(doctree.findall(nodes.section), None)
    if section is None:
        doctree.insert(0, paragraph)
        return
    at = 1 if section.children and isinstance(section[0], nodes.title) else 0
    for i, child in enumerate(section.children):
        if isinstance(child, nodes.section):
            break
        if isinstance(child, nodes.paragraph):
            at = i + 1
            break
    section.insert(at, paragraph)


def runtime_paragraph(sentence: str, link: str | None, refuri: str | None) -> nodes.paragraph:
    """The sentence as a paragraph, with its `link` text (the provenance page's title) a link to refuri."""
    para = nodes.paragraph(classes=[RUNTIME_CLASS])
    if not (link and refuri and link in sentence):
        para += nodes.Text(sentence)
        return para
    before, _, after = sentence.partition(link)
    para += [nodes.Text(before), nodes.reference("", link, internal=True, refuri=refuri), nodes.Text(after)]
    return para


def add_runtime_sentence(app, doctree, docname):
    """doctree-resolved: on a chapter's page, how long it took to execute and where (runtime_sentence).
    The LaTeX builder resolves one doctree for the whole book, each page in it under a start_of_file."""
    if app.builder.format == "latex":
        from sphinx import addnodes
        for page in list(doctree.findall(addnodes.start_of_file)):
            _add_runtime_sentence(app, page, page["docname"])
        return
    _add_runtime_sentence(app, doctree, docname)


def section_unit(docname: str) -> str:
    """What a page calls itself: 本节 on a chapter's section page (chapters/NN_M_name), else 本章."""
    return "本节" if re.match(r"\d+_\d+_", docname.rpartition("/")[2]) else "本章"


def _add_runtime_sentence(app, doctree, docname):
    if docname not in {book.docname(md) for md in book.chapters()}:
        return
    rows, machine = rows_of_this_build(app)
    run = next(r["run"] for r in rows if r["docname"] == docname)
    page = next(iter(pages_with_the_table(app, app.env)), None)  # the provenance page
    link = app.env.titles[page].astext() if page in app.env.titles else None
    sentence = runtime_sentence(run["how"], run["seconds"], run["record"], machine, link, section_unit(docname))
    refuri = app.builder.get_relative_uri(docname, page) if link else None
    insert_after_first_paragraph(doctree, runtime_paragraph(sentence, link, refuri))


def _link(app, fromdoc, todoc, text):
    para = nodes.paragraph()
    para += nodes.reference("", text, internal=True, refuri=app.builder.get_relative_uri(fromdoc, todoc))
    return para


def _table(header, rows):
    table = nodes.table(classes=["colwidths-auto"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in header)
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body
    for cells, parent in [(header, head)] + [(r, body) for r in rows]:
        row = nodes.row()
        for cell in cells:  # a node, a string, or a list of strings (a paragraph each)
            if isinstance(cell, nodes.Node):
                row += nodes.entry("", cell)
            else:
                row += nodes.entry("", *(nodes.paragraph(text=t) for t in ([cell] if isinstance(cell, str) else cell)))
        parent += row
    return table


def setup(app):
    app.add_node(ProvenanceNode)
    app.add_directive("provenance-table", ProvenanceTable)
    app.connect("builder-inited", note_build_start)
    app.connect("env-updated", pages_with_the_table)
    app.connect("doctree-resolved", fill_table)
    app.connect("doctree-resolved", add_runtime_sentence)
