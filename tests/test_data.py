import pytest
import torch

import data


@pytest.fixture(scope="module")
def corpus():
    return data.load_corpus()


def test_corpus_shape(corpus):
    assert len(corpus) == 21_050
    assert sum(len(c.split(data.SEP, 2)[2]) for c in corpus) == 1_707_089


def test_split_is_by_whole_ci_and_deterministic(corpus):
    train, val = data.split_corpus(corpus)
    assert len(train) + len(val) == len(corpus)
    assert data.split_corpus(corpus) == (train, val)
    assert 0.04 < len(val) / len(corpus) < 0.06
    assert set(train).isdisjoint(val) or len(set(train) & set(val)) < 5  # a few ci are duplicated in the source


def test_every_ci_round_trips(corpus):
    sp = data.load_tokenizer()
    assert sp.vocab_size() == 8192
    assert all(sp.decode(ids) == c for ids, c in zip(sp.encode(corpus), corpus))


def test_tokens_are_the_ci_in_order(corpus):
    sp = data.load_tokenizer()
    tok = data.load_tokens()
    train, val = data.split_corpus(corpus)
    for part, ids in ((train, tok.train), (val, tok.val)):
        ends = (torch.nonzero(ids == tok.eos_id).flatten() + 1).tolist()  # each ci ends with eos
        assert len(ends) == len(part) and ends[-1] == len(ids)
        starts = [0] + ends[:-1]
        for i in (0, 1, len(part) // 2, len(part) - 1):
            assert sp.decode(ids[starts[i]:ends[i] - 1].tolist()) == part[i]


def test_cache_is_reused_and_rebuild_is_identical(tmp_path, monkeypatch):
    first = data.cache_dir()
    assert data.cache_dir() == first  # reused, not rebuilt
    monkeypatch.setattr(data, "CACHE_DIR", tmp_path / "cache")
    second = data.cache_dir()
    assert second != first and second.name == first.name
    for name in ("tokenizer.model", "tokens.npz"):
        assert (second / name).read_bytes() == (first / name).read_bytes()


def test_changed_corpus_rebuilds(tmp_path, monkeypatch, corpus):
    monkeypatch.setattr(data, "CACHE_DIR", tmp_path / "cache")
    small = tmp_path / "small.txt"
    small.write_text("\n".join(corpus[:3000]) + "\n", encoding="utf-8")
    a = data.cache_dir(small)
    small.write_text("\n".join(corpus[:3001]) + "\n", encoding="utf-8")
    b = data.cache_dir(small)
    assert a != b


def test_missing_corpus_is_one_clear_error(tmp_path):
    with pytest.raises(data.CorpusError, match="not found"):
        data.load_corpus(tmp_path / "songci.txt")


@pytest.mark.parametrize("content,match", [
    (b"\xff\xfe broken", "not valid UTF-8"),
    ("no separators here\n".encode(), "expected"),
    (b"", "empty"),
])
def test_corrupt_corpus_is_one_clear_error(tmp_path, content, match):
    path = tmp_path / "songci.txt"
    path.write_bytes(content)
    with pytest.raises(data.CorpusError, match=match):
        data.load_corpus(path)


def test_corrupt_token_cache_is_removed_and_rebuilt(tmp_path, monkeypatch, corpus):
    monkeypatch.setattr(data, "CACHE_DIR", tmp_path / "cache")
    small = tmp_path / "small.txt"
    small.write_text("\n".join(corpus[:3000]) + "\n", encoding="utf-8")
    folder = data.cache_dir(small)
    (folder / "tokens.npz").write_bytes(b"not a zip file")
    with pytest.raises(data.CorpusError, match="rebuild"):
        data.load_tokens(small)
    assert not folder.exists()
    assert len(data.load_tokens(small).train) > 0
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("build-")]


class FakeSP:
    """The four kinds of pieces token_bytes must tell apart."""
    pieces = ["<unk>", "<s>", "</s>", "<0xE4>", "宋", "词▁a"]

    def get_piece_size(self): return len(self.pieces)
    def is_byte(self, i): return i == 3
    def eos_id(self): return 2
    def is_control(self, i): return i in (1, 2)
    def is_unknown(self, i): return i == 0
    def id_to_piece(self, i): return self.pieces[i]


def test_token_bytes_counts_utf8_bytes():
    assert data.token_bytes(FakeSP()).tolist() == [0, 0, 1, 1, 3, 3 + 2]


def test_get_batch_targets_are_shifted_inputs():
    tokens = torch.arange(1000)
    g = torch.Generator().manual_seed(0)
    x, y = data.get_batch(tokens, 4, 16, g)
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_fixed_batches_repeat():
    tokens = torch.arange(1000)
    a = data.fixed_batches(tokens, 3, 2, 8, seed=7)
    b = data.fixed_batches(tokens, 3, 2, 8, seed=7)
    assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))
