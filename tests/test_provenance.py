"""The provenance page's pieces (bookbuild/provenance.py) and bookbuild.cuda.stored_gpu_run."""
import contextlib
import datetime
import io
import json
import re

import jupytext
import nbformat
import pytest

import measure
from bookbuild import book, cuda, provenance

UTC = datetime.timezone.utc
START = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def printed_record():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        measure.print_record()
    return out.getvalue()


def test_parse_record_reads_what_print_record_prints():
    text = printed_record()
    record = {k: str(v) for k, v in measure.experiment_record().items()}
    record.pop("date")  # a minute may have passed
    parsed = provenance.parse_record(text)
    assert {k: v for k, v in parsed.items() if k != "date"} == record
    assert set(provenance.MACHINE_KEYS) <= set(parsed)


def test_record_of_finds_the_record_cell():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("print('ran: 3 s')\nprint_record()", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="chapter ran in 3 s\nnote: x\nnot a record line\n"
                                                                  "          CPU: Some CPU\n    CPU cores: 2\n")])])
    assert provenance.record_of(nb) == {"CPU": "Some CPU", "CPU cores": "2"}
    assert provenance.record_of(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])) == {}


@pytest.mark.parametrize("md", book.chapters(), ids=lambda p: p.name)
def test_every_chapter_prints_a_record_the_page_can_read(md):
    record = provenance.record_of(jupytext.read(md.with_suffix(".ipynb")))
    assert set(provenance.MACHINE_KEYS) <= set(record), (
        f"{md.name}: its last cell should end with `{provenance.RECORD_CALL}`, whose output the provenance page reads")


def test_how_executed():
    before, after = START - datetime.timedelta(hours=1), START + datetime.timedelta(minutes=3)
    assert provenance.how_executed(after, None, START) == "build"
    assert provenance.how_executed(before, None, START) == "earlier build"
    assert provenance.how_executed(before, "nbval", START) == "nbval"
    assert provenance.how_executed(None, None, START, succeeded=None) == "not executed"
    assert provenance.how_executed(after, None, START, succeeded=False) == "failed"


def test_machine_text_names_another_machine():
    here = {"CPU": "CPU A", "CPU cores": "2", "python": "3.11.9", "torch": "2.5.1", "OS": "Debian"}
    assert provenance.machine_text(dict(here, **{"git commit": "abc1234"}), here) == "构建这一版的机器"
    other = provenance.machine_text(dict(here, CPU="CPU B", **{"CPU cores": "16"}), here)
    assert "CPU B" in other and "16 核" in other and "3.11.9" in other
    assert provenance.machine_text({}, here) == "（本章没有实验记录）"
    isa = dict(here, ISA="AVX2 (torch kernels: AVX2)", **{"torch threads": "4"})
    same = provenance.machine_text(isa, dict(here, ISA=isa["ISA"]))
    assert same == "构建这一版的机器，AVX2 (torch kernels: AVX2)，4 个线程"
    capped = provenance.machine_text(isa, dict(here, ISA="AVX-512 (torch kernels: AVX512)"))
    assert "CPU A" in capped and "AVX2" in capped  # the same CPU with its kernels capped is another machine


def test_cuda_text():
    stored = {"gpu": "NVIDIA H200", "date": "2026-11-30", "commit": "abc1234"}
    assert provenance.cuda_text(False, stored) == ""  # a chapter without CUDA cells says nothing of GPUs
    assert "还没有存档的 GPU 运行" in provenance.cuda_text(True, None)
    text = provenance.cuda_text(True, stored)
    assert all(v in text for v in stored.values()) and "存档的一次 GPU 运行" in text


def test_how_text_says_once_where_the_outputs_come_from_in_plain_chinese():
    assert provenance.how_text("build", False, None) == "这次构建时执行。"
    nbval = provenance.how_text("nbval", False, None)
    assert nbval.startswith("沿用运行本书测试时的执行") and "代码和输入都没变" in nbval
    assert "GPU" not in provenance.how_text("earlier build", False, None)
    assert provenance.how_text("not executed", True, None) == (
        "没有执行，页面上没有它的输出。要 GPU 的几格构建时不执行，也还没有存档的 GPU 运行，它们下面没有输出。")
    for how in provenance.HOW:  # a reader's words, not the build's: no tool names, no cache
        assert not re.search(r"[A-Za-z]|缓存", provenance.HOW[how]), provenance.HOW[how]


def test_margins_are_said_in_chinese_one_claim_a_line():
    record = ("validation loss drop over the run ×1.13 (2.83 > 2.5); "
              "peak of the blocked loss, against the full logits ×2.96 (1.26e+08 < 3.72e+08); "
              "crossover above the smallest message ×10 ×5.90 (2.36e+05 > 4e+04); "
              "smallest fall between evaluation points +0.0384 (0.0384 > 0)")
    assert provenance.margins_text(record) == [
        "「validation loss drop over the run」：测得 2.83，应大于 2.5，测得值是界限的 1.13 倍。",
        "「peak of the blocked loss, against the full logits」：测得 1.26 × 10⁸，应小于 3.72 × 10⁸，"
        "界限是测得值的 2.96 倍。",
        "「crossover above the smallest message ×10」：测得 2.36 × 10⁵，应大于 4 × 10⁴，测得值是界限的 5.90 倍。",
        "「smallest fall between evaluation points」：测得 0.0384，应大于 0，高出界限 0.0384。"]
    assert provenance.margins_text(None) == ["本章没有对量出来的数字下断言。"]
    assert provenance.margins_text("something else") == ["something else"]  # shown as it is, never dropped
    assert provenance.number_text("-1e-05") == "-1 × 10⁻⁵" and provenance.number_text("0.5") == "0.5"


def test_a_row_reads_when_and_how_long_and_only_how_it_differs():
    row = {"how_text": "这次构建时执行。", "when": "2026-12-07 07:59 UTC", "seconds": 226.3,
           "machine": "构建这一版的机器", "commit": "6f552f1", "margins": ["本章没有对量出来的数字下断言。"],
           "reference": "存参考输出时训练一步 153 ms，是这台 CPU 最快一次（153 ms）的 1.0 倍"}
    common = provenance.common_case([row, row, dict(row, how_text="沿用。")])
    assert common == ("这次构建时执行。", "构建这一版的机器；代码提交 6f552f1")
    assert provenance.row_cells(row, common) == ["2026-12-07 07:59 UTC，用了 3 分 46 秒",
                                                 ["本章没有对量出来的数字下断言。"],
                                                 row["reference"], "—"]
    never = provenance.row_cells(dict(row, when=None, seconds=None, commit=None, machine="（本章没有实验记录）"),
                                 common)
    assert never[0] == "没有执行，用时没有记录" and never[-1] == ["（本章没有实验记录）"]
    assert provenance.row_cells(dict(row, how_text="沿用。"), common)[-1] == ["沿用。"]
    assert len(provenance.ROW_HEADER) == 1 + len(never)


def test_stored_gpu_run(tmp_path):
    md = tmp_path / "06_x.md"
    md.write_text("# x\n", encoding="utf-8")
    assert cuda.stored_gpu_run(md) is None  # no .ipynb
    nb = nbformat.v4.new_notebook()
    nbformat.write(nb, md.with_suffix(".ipynb"))
    assert cuda.stored_gpu_run(md) is None
    run = {"gpu": "NVIDIA H200", "date": "2026-11-30", "commit": "abc1234"}
    nb.metadata["gpu_run"] = run
    nbformat.write(nb, md.with_suffix(".ipynb"))
    assert cuda.stored_gpu_run(md) == run
    assert json.loads(md.with_suffix(".ipynb").read_text())["metadata"]["gpu_run"] == run


def test_a_page_title_is_its_first_level_one_heading_outside_code(tmp_path):
    md = tmp_path / "09_x.md"
    md.write_text("---\nkernelspec:\n  name: python3\n---\n\n```{code-cell} ipython3\n# a comment, not a title\n```\n\n"
                  "## a section\n\n# 第12章　标题\n\n# 另一个一级标题\n", encoding="utf-8")
    assert book.title(md) == "第12章　标题"
    md.write_text("## only a section\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no title"):
        book.title(md)


def test_the_record_carries_the_tightest_margins_to_the_page(monkeypatch):
    monkeypatch.setattr(measure, "CHECKS", [])
    measure.check("gain", 300.0, ">", 100.0)
    assert provenance.parse_record(printed_record())["margins"] == "gain ×3.00 (300 > 100)"


# ---- the sentence at the top of each chapter's page: how long it took to execute, and where ----

HERE = {"CPU": "AMD EPYC", "CPU cores": "2", "python": "3.11.9", "torch": "2.5.1", "ISA": "AVX-512"}
LINK = "本书的数字从哪里来"


def test_duration_text():
    assert provenance.duration_text(192.4) == "3 分 12 秒"
    assert provenance.duration_text(45) == "45 秒"
    assert provenance.duration_text(180) == "3 分"
    assert provenance.duration_text(3720) == "1 小时 2 分"
    assert provenance.duration_text(3601) == "1 小时 1 秒"
    assert provenance.duration_text(0.2) == "不到 1 秒"


def test_runtime_sentence_names_the_cpu_and_the_time():
    for how in ("build", "earlier build", "nbval"):
        assert provenance.runtime_sentence(how, 192.4, dict(HERE), HERE, LINK) == (
            f"在构建本书的机器上（AMD EPYC，2 核），本章从头到尾执行用了 3 分 12 秒；你的机器上会不同，见{LINK}。")
    other = provenance.runtime_sentence("nbval", 61, dict(HERE, CPU="Intel Xeon", **{"CPU cores": "16"}), HERE, LINK)
    assert other == ("本页的输出来自另一台机器（Intel Xeon，16 核）上的一次执行，"
                     f"本章在那里从头到尾执行用了 1 分 1 秒；你的机器上会不同，见{LINK}。")
    assert "执行用时没有记录" in provenance.runtime_sentence("build", None, dict(HERE), HERE, LINK)
    assert "没有留下实验记录" in provenance.runtime_sentence("build", 10, {}, HERE, LINK)
    assert provenance.runtime_sentence("build", 10, dict(HERE), HERE, None).endswith("你的机器上会不同。")
    unit = provenance.section_unit("chapters/09_1_noise")
    section = provenance.runtime_sentence("build", 10, dict(HERE), HERE, LINK, unit)
    assert "，本节从头到尾执行用了" in section and "本章" not in section  # a section page speaks of itself
    assert provenance.section_unit("chapters/09_scaling") == "本章"
    assert provenance.section_unit("chapters/12_2_plan") == "本节"


def test_runtime_sentence_says_plainly_when_nothing_ran():
    failed = provenance.runtime_sentence("failed", None, {}, HERE, LINK)
    assert failed == f"构建本书时本章执行失败，页面上没有它的输出；见{LINK}。"
    not_run = provenance.runtime_sentence("not executed", None, {}, HERE, None)
    assert not_run == "构建本书时没有执行本章，页面上没有它的输出。"
    assert all(h in provenance.HOW for h in ("failed", "not executed", "build", "earlier build", "nbval"))


def chapter_doctree(*children):
    """A page as the build reads it: a level-1 section with its title and `children`."""
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document
    doc = new_document("test", get_default_settings(Parser))
    section = nodes.section()
    section += nodes.title(text="第1章　数据与模型")
    section += list(children)
    doc += section
    return doc, section


def test_the_sentence_goes_after_the_first_paragraph_under_the_title():
    from docutils import nodes
    cell = nodes.container(classes=["cell"])
    doc, section = chapter_doctree(nodes.paragraph(text="第一段"), cell, nodes.paragraph(text="第二段"))
    para = provenance.runtime_paragraph(f"用了 3 秒；见{LINK}。", LINK, "provenance.html")
    provenance.insert_after_first_paragraph(doc, para)
    texts = [c.astext() for c in section.children]
    assert texts == ["第1章　数据与模型", "第一段", f"用了 3 秒；见{LINK}。", "", "第二段"]  # "": the cell
    assert section[2]["classes"] == [provenance.RUNTIME_CLASS]
    (ref,) = section[2].findall(nodes.reference)
    assert ref.astext() == LINK and ref["refuri"] == "provenance.html"

    sub = nodes.section()  # no paragraph before the first subsection: right below the title
    sub += [nodes.title(text="1.1"), nodes.paragraph(text="小节的段落")]
    doc, section = chapter_doctree(nodes.container(), sub)
    provenance.insert_after_first_paragraph(doc, provenance.runtime_paragraph("一句话。", None, None))
    assert [c.astext() for c in section.children][:2] == ["第1章　数据与模型", "一句话。"]
    assert len(sub.children) == 2


def test_each_chapter_page_gets_its_own_sentence(monkeypatch):
    """add_runtime_sentence, as the build calls it once a chapter's page is resolved."""
    from types import SimpleNamespace

    from docutils import nodes
    first, second = (book.docname(md) for md in book.chapters()[:2])
    rows = [{"docname": first, "run": {"how": "build", "seconds": 192.4, "record": dict(HERE)}},
            {"docname": second, "run": {"how": "failed", "seconds": None, "record": {}}}]
    app = SimpleNamespace(provenance_rows=(rows, HERE),
                          env=SimpleNamespace(titles={"chapters/provenance": nodes.title(text=LINK)}),
                          builder=SimpleNamespace(format="html", get_relative_uri=lambda a, b: f"../{b}.html"))
    monkeypatch.setattr(provenance, "pages_with_the_table", lambda app, env: ["chapters/provenance"])
    for docname, says in ((first, "从头到尾执行用了 3 分 12 秒"), (second, "执行失败")):
        doc, section = chapter_doctree(nodes.paragraph(text="引言"))
        provenance.add_runtime_sentence(app, doc, docname)
        assert says in section[2].astext() and section[2]["classes"] == [provenance.RUNTIME_CLASS]
        assert next(section[2].findall(nodes.reference))["refuri"] == "../chapters/provenance.html"
    doc, section = chapter_doctree(nodes.paragraph(text="术语"))
    provenance.add_runtime_sentence(app, doc, "chapters/glossary")  # not a chapter: nothing added
    assert len(section.children) == 2
