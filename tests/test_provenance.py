"""The provenance page's pieces (bookbuild/provenance.py) and bookbuild.cuda.stored_gpu_run."""
import contextlib
import datetime
import io
import json

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
    assert provenance.machine_text(dict(here, **{"git commit": "abc1234"}), here) == "本构建机器"
    other = provenance.machine_text(dict(here, CPU="CPU B", **{"CPU cores": "16"}), here)
    assert "CPU B" in other and "16 核" in other and "3.11.9" in other
    assert provenance.machine_text({}, here) == "（本章没有实验记录）"
    isa = dict(here, ISA="AVX2 (torch kernels: AVX2)", **{"torch threads": "4"})
    same = provenance.machine_text(isa, dict(here, ISA=isa["ISA"]))
    assert same == "本构建机器，AVX2 (torch kernels: AVX2)，4 个线程"
    capped = provenance.machine_text(isa, dict(here, ISA="AVX-512 (torch kernels: AVX512)"))
    assert "CPU A" in capped and "AVX2" in capped  # the same CPU with its kernels capped is another machine


def test_cuda_text():
    stored = {"gpu": "NVIDIA H200", "date": "2026-11-30", "commit": "abc1234"}
    assert provenance.cuda_text(False, stored) == ""  # a chapter without CUDA cells says nothing of GPUs
    assert "没有保存的 GPU 运行" in provenance.cuda_text(True, None)
    text = provenance.cuda_text(True, stored)
    assert all(v in text for v in stored.values()) and "保存的 GPU 运行" in text


def test_numbers_text_says_which_execution():
    assert provenance.numbers_text("build", False, None) == "来自这次构建的执行。"
    assert "较早" in provenance.numbers_text("nbval", False, None)
    assert "GPU" not in provenance.numbers_text("earlier build", False, None)
    assert "没有执行输出" in provenance.numbers_text("not executed", True, None)


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
                  "## a section\n\n# 第9章　标题\n\n# 另一个一级标题\n", encoding="utf-8")
    assert book.title(md) == "第9章　标题"
    md.write_text("## only a section\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no title"):
        book.title(md)


def test_the_record_carries_the_tightest_margins_to_the_page(monkeypatch):
    monkeypatch.setattr(measure, "CHECKS", [])
    measure.check("gain", 300.0, ">", 100.0)
    assert provenance.parse_record(printed_record())["margins"] == "gain ×3.00 (300 > 100)"
