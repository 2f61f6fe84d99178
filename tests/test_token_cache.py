"""The token cache (data.cache_dir) built by several processes at once, as the ranks of a first
multi-GPU run on a fresh machine do: only local rank 0 builds it, the others wait for it, and none
removes the complete folder another one renamed into place."""
import os
import subprocess
import sys
import threading

import pytest

import data


def test_a_later_build_keeps_the_folder_another_process_completed(tmp_path, monkeypatch):
    """While this process builds, another one finishes and renames its folder into place (and may be
    reading it): this build must leave that folder as it is."""
    monkeypatch.setattr(data, "CACHE_DIR", tmp_path / "cache")
    final = tmp_path / "cache" / data._cache_key(data.CORPUS_PATH)

    def build_while_another_finishes(lines, out):
        for f in ("tokens.npz", "tokenizer.model"):
            (out / f).write_bytes(b"ours")
        final.mkdir()
        for f in ("tokens.npz", "tokenizer.model", "theirs"):
            (final / f).write_bytes(b"theirs")
    monkeypatch.setattr(data, "_build", build_while_another_finishes)
    assert data.cache_dir() == final
    assert (final / "theirs").is_file() and (final / "tokens.npz").read_bytes() == b"theirs"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [final.name]  # no temporary folder left


def test_a_folder_completed_after_the_check_is_never_removed(tmp_path, monkeypatch):
    """The window between looking at the folder and renaming into place: another machine's process (on a
    shared disk) renames its complete folder in just after this one found none. Nothing removes it."""
    monkeypatch.setattr(data, "CACHE_DIR", tmp_path / "cache")
    final = tmp_path / "cache" / data._cache_key(data.CORPUS_PATH)
    complete, calls, removed = data._complete, [], []

    def complete_then_theirs_arrives(folder):
        answer = complete(folder)
        calls.append(folder)
        if len(calls) == 2 and not final.exists():  # after the answer: theirs lands in the window
            final.mkdir()
            for f in ("tokens.npz", "tokenizer.model"):
                (final / f).write_bytes(b"theirs")
        return answer

    def ours(lines, out):
        for f in ("tokens.npz", "tokenizer.model"):
            (out / f).write_bytes(b"ours")
    rmtree = data.shutil.rmtree
    monkeypatch.setattr(data, "_complete", complete_then_theirs_arrives)
    monkeypatch.setattr(data, "_build", ours)
    monkeypatch.setattr(data.shutil, "rmtree", lambda p, **k: (removed.append(p), rmtree(p, **k)))
    assert data.cache_dir() == final and data._complete(final)
    assert final not in removed
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [final.name]


def test_other_local_ranks_wait_for_local_rank_0(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setenv("LOCAL_RANK", "1")
    final = tmp_path / "cache" / data._cache_key(data.CORPUS_PATH)

    def not_here(lines, out):
        raise AssertionError("a process other than local rank 0 trained the tokenizer")

    def local_rank_0():
        (tmp_path / "cache" / "build-x").mkdir(parents=True)
        for f in ("tokens.npz", "tokenizer.model"):
            (tmp_path / "cache" / "build-x" / f).write_bytes(b"rank 0's")
        os.rename(tmp_path / "cache" / "build-x", final)
    monkeypatch.setattr(data, "_build", not_here)
    builder = threading.Timer(1.0, local_rank_0)
    builder.start()
    try:
        assert data.cache_dir() == final
    finally:
        builder.join()
    assert (final / "tokens.npz").read_bytes() == b"rank 0's"


def test_a_wait_that_never_ends_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(data, "CACHE_WAIT_S", 1)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(data.CorpusError, match=r"^local rank 0 did not finish the token cache .* within 1 s; "):
        data.cache_dir()


def test_a_foreign_incomplete_folder_is_refused_not_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "CACHE_DIR", tmp_path / "cache")
    final = tmp_path / "cache" / data._cache_key(data.CORPUS_PATH)
    final.mkdir(parents=True)
    (final / "notes.txt").write_text("a reader's")

    def ours(lines, out):
        for f in ("tokens.npz", "tokenizer.model"):
            (out / f).write_bytes(b"ours")
    monkeypatch.setattr(data, "_build", ours)
    with pytest.raises(data.CorpusError, match="lacks tokens.npz or tokenizer.model"):
        data.cache_dir()
    assert [p.name for p in final.iterdir()] == ["notes.txt"]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [final.name]  # no temporary folder left


PROBE = """
import sys
from pathlib import Path
sys.path.insert(0, {code!r})
import data
data.CACHE_DIR = Path({cache!r})
sp, tokens = data.load_tokenizer(), data.load_tokens()
print(sp.get_piece_size(), len(tokens.train), len(tokens.val))
"""


@pytest.mark.slow  # four processes: two machines' local ranks 0 build, their local ranks 1 wait
def test_four_processes_on_an_empty_cache_all_succeed(tmp_path):
    code = PROBE.format(code=str(data.REPO / "code"), cache=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "LOCAL_RANK": str(i % 2)}) for i in range(4)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, results
    assert len({out for out, _ in results}) == 1, results
    assert len(list((tmp_path / "cache").iterdir())) == 1
