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
        n, lossy = encode_files([a, b], out, chunk_chars=chunk, sp=sp, allow_lossy=True)
        assert lossy["lines"] == 1 and lossy["all_lines"] == 4  # "Hello, world 123!": its spaces
        got = np.fromfile(out, dtype=np.uint16)
        assert n == len(got) == len(want)
        assert np.array_equal(got, want)
    # the ids decode back to the text, one document per eos (this tokenizer decodes a space as ▁)
    docs = np.split(got, np.flatnonzero(got == sp.eos_id()) + 1)[:-1]
    want = [x.rstrip("\r") for x in LINES if x.strip()] + ["青玉案｜辛弃疾｜东风夜放花千树。"]
    assert [sp.decode(d[:-1].tolist()).replace("\u2581", " ") for d in docs] == want


def test_text_the_book_tokenizer_cannot_represent_is_refused_with_how_much(tmp_path, capsys):
    text = tmp_path / "en.txt"
    lines = ["浣溪沙｜晏殊｜一曲新词酒一杯。", "plain English text", "青玉案｜辛弃疾｜东风夜放花千树。"]
    text.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = tmp_path / "out.bin"
    with pytest.raises(SystemExit) as e:
        main([str(text), "--out", str(out)])
    msg = capsys.readouterr().err
    assert e.value.code != 0 and msg.count("\n") == 1
    assert "cannot represent 1 of 3 lines exactly" in msg and "--train-tokenizer" in msg
    assert "' ' at character 6 decodes as '▁'" in msg
    assert not out.exists() and not (tmp_path / "out.bin.tmp").exists()
    main([str(text), "--out", str(out), "--allow-lossy"])
    assert "warning: --allow-lossy: 1 of 3 lines" in capsys.readouterr().out and out.is_file()


def test_bad_utf8_is_one_sentence_and_leaves_no_output(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("好的\n".encode() + b"\xff\xfe broken\n")
    out = tmp_path / "out.bin"
    with pytest.raises(SystemExit) as e:
        main([str(bad), "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "not valid UTF-8" in err and "bad.txt" in err
    assert not out.exists() and not (tmp_path / "out.bin.tmp").exists()


def test_missing_input_and_bad_chunk_are_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o.bin")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err
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


MIXED = ["The quick brown fox jumps over the lazy dog.", "  two leading spaces, two  inner, one trailing ",
         "东风夜放花千树，更吹落、星如雨。", "emoji 😀🎉 and a flag 🇨🇳 in text", "tabs\tand\tmore\ttabs",
         "Mixed 中文 and English 123 ok"]


def test_trained_tokenizer_round_trips_any_line_exactly(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(MIXED * 40) + "\n", encoding="utf-8")  # a multi-line file
    out = tmp_path / "mine.bin"
    main([str(corpus), "--out", str(out), "--train-tokenizer", "--vocab-size", "400", "--sample-lines", "150"])
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "mine.tokenizer.model"))
    ids = np.fromfile(out, dtype=np.uint16)
    docs = np.split(ids, np.flatnonzero(ids == sp.eos_id()) + 1)[:-1]
    assert [sp.decode(d[:-1].tolist()) for d in docs] == MIXED * 40  # the token file decodes to the text
    unseen = ["Hello,   world!", " x ", "   ", "新词 🫠 Ünïcödé\u00a0nbsp", "a\u200bb", "Ω≈ç√∫"]
    for text in unseen:  # text the tokenizer never saw round-trips too (byte fallback)
        assert sp.decode(sp.encode(text)) == text, text
    # the space marker merges with words ("▁the"): "▁" is not forced to stand alone
    assert any(sp.id_to_piece(i).startswith("\u2581") and sp.id_to_piece(i)[1:].isalpha()
               for i in range(sp.get_piece_size()))


def test_train_gpu_finds_the_tokenizer_beside_the_token_file(tmp_path):
    from train_gpu import TokenSource
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(MIXED * 100) + "\n", encoding="utf-8")
    main([str(corpus), "--out", str(tmp_path / "t.bin"), "--train-tokenizer", "--vocab-size", "400"])
    src = TokenSource(tmp_path / "t.bin", 512, 16)
    assert src.tokenizer_name == "t.tokenizer.model" and src.tokenizer.get_piece_size() <= 400
    assert len(src.val) == int(0.05 * (len(src.train) + len(src.val)))


@pytest.mark.parametrize("arrange, expect", [
    (lambda t: [str(t.joinpath("e.txt")), "--out", str(t / "o.bin")], "the input is empty"),
    (lambda t: [t.joinpath("b.txt").write_text("\n  \n\n") and str(t / "b.txt"), "--out", str(t / "o.bin")],
     "no text (every line is blank)"),
    (lambda t: [str(t / "x.txt"), "--out", str(t)], "is a directory, not a file"),
    (lambda t: [str(t / "x.txt"), "--out", "."], "is a directory, not a file"),
    (lambda t: [str(t / "x.txt"), "--out", str(t / "x.txt" / "o.bin")], "which is a file, not a folder"),
    (lambda t: [str(t / "x.txt"), "--out", "/proc/self/o.bin"], "not writable"),
    (lambda t: [str(t / "x.txt"), "--out", str(t / "x.txt")], "overwrite the input"),
    (lambda t: [str(t / "x.txt"), "--out", str(t / "o.bin"), "--train-tokenizer", "--vocab-size", "100"],
     "too small"),
    (lambda t: [str(t / "x.txt"), "--out", str(t / "o.bin"), "--train-tokenizer", "--vocab-size", "70000"],
     "does not fit uint16"),
    (lambda t: [t.joinpath("many.txt").write_text("".join(map(chr, range(0x4e00, 0x4e00 + 200))) + "\n")
                and str(t / "many.txt"), "--out", str(t / "o.bin"), "--train-tokenizer", "--vocab-size", "300"],
     "SentencePiece could not train the tokenizer"),
], ids=["empty file", "blank lines only", "out is a directory", "out is .", "out under a file", "out not writable",
        "out is the input", "vocab too small", "vocab too large", "vocab below the corpus's characters"])
def test_bad_input_is_one_sentence(tmp_path, capsys, arrange, expect):
    (tmp_path / "e.txt").write_bytes(b"")
    (tmp_path / "x.txt").write_text("some text\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        main(arrange(tmp_path))
    message = e.value.code if isinstance(e.value.code, str) else capsys.readouterr().err.strip()
    assert e.value.code != 0 and "\n" not in message and expect in message, message
    assert not (tmp_path / "o.bin").exists() and not list(tmp_path.glob("*.tmp"))
