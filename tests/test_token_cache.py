"""The token cache (data.cache_dir) built by several processes at once, as the ranks of a first
multi-GPU run on a fresh machine do: none removes the complete folder another one renamed into place."""
import subprocess
import sys

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


PROBE = """
import sys
from pathlib import Path
sys.path.insert(0, {code!r})
import data
data.CACHE_DIR = Path({cache!r})
sp, tokens = data.load_tokenizer(), data.load_tokens()
print(sp.get_piece_size(), len(tokens.train), len(tokens.val))
"""


@pytest.mark.slow  # four processes each build the tokenizer and encode the corpus
def test_four_processes_on_an_empty_cache_all_succeed(tmp_path):
    code = PROBE.format(code=str(data.REPO / "code"), cache=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, results
    assert len({out for out, _ in results}) == 1, results
    assert len(list((tmp_path / "cache").iterdir())) == 1
