import subprocess
import sys

import numpy as np
import pytest

from data import REPO, load_tokenizer
from prepare_tokens import encode_files, main

LINES = ["浣溪沙｜晏殊｜一曲新词酒一杯，去年天气旧亭台。", "", "Hello, world 123!", "  ", "□□无名｜佚名｜残句。\r"]


@pytest.fixture(scope="module")
def sp():
    return load_tokenizer()


def expected_ids(sp, lines):
    out = []
    for line in lines:
        line = line.rstrip("\r\n")
        if line.strip():
            out += sp.encode(line) + [sp.eos_id()]
    return np.array(out, dtype=np.uint16)


def test_ids_are_each_line_then_eos_and_chunking_does_not_matter(tmp_path, sp):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    b.write_text("青玉案｜辛弃疾｜东风夜放花千树。", encoding="utf-8")  # no final newline
    want = np.concatenate([expected_ids(sp, LINES), expected_ids(sp, ["青玉案｜辛弃疾｜东风夜放花千树。"])])
    for chunk in (1, 7, 1 << 22):
        out = tmp_path / f"out{chunk}.bin"
        n = encode_files([a, b], out, chunk_chars=chunk, sp=sp)
        got = np.fromfile(out, dtype=np.uint16)
        assert n == len(got) == len(want)
        assert np.array_equal(got, want)
    # the ids decode back to the text, one document per eos (this tokenizer decodes a space as ▁)
    docs = np.split(got, np.flatnonzero(got == sp.eos_id()) + 1)[:-1]
    assert [sp.decode(d[:-1].tolist()).replace("\u2581", " ") for d in docs] == [x.rstrip("\r") for x in LINES if x.strip()] + \
        ["青玉案｜辛弃疾｜东风夜放花千树。"]


def test_bad_utf8_is_one_sentence_and_leaves_no_output(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("好的\n".encode() + b"\xff\xfe broken\n")
    out = tmp_path / "out.bin"
    with pytest.raises(SystemExit) as e:
        main([str(bad), "--out", str(out)])
    assert "not valid UTF-8" in str(e.value.code) and "bad.txt" in str(e.value.code)
    assert not out.exists() and not (tmp_path / "out.bin.tmp").exists()


def test_missing_input_and_bad_chunk_are_errors(tmp_path):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o.bin")])
    assert "does not exist" in str(e.value.code)
    (tmp_path / "x.txt").write_text("x\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "x.txt"), "--out", str(tmp_path / "o.bin"), "--chunk-chars", "0"])
    assert e.value.code == 2


def test_command_line_converts_the_corpus_sample(tmp_path):
    sample = tmp_path / "sample.txt"
    lines = (REPO / "data" / "songci.txt").read_text(encoding="utf-8").splitlines()[:200]
    sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "sample.bin"
    r = subprocess.run([sys.executable, str(REPO / "code" / "prepare_tokens.py"), str(sample), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ids = np.fromfile(out, dtype=np.uint16)
    assert f"wrote {len(ids):,} tokens" in r.stdout
    assert (ids == load_tokenizer().eos_id()).sum() == 200
