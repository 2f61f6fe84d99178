"""bookbuild/pyodide.py: what chapter 12's calculator loads, and how a build without Pyodide says so."""
import io
import json
import os
import stat
import tarfile

import pytest

from bookbuild import pyodide


def test_the_page_gets_budget_py_and_what_importing_it_imports():
    names = pyodide.modules()
    assert names == ["arguments.py", "budget.py", "gpus.py", "memory.py", "shapes.py"]
    assert "model.py" not in names  # memory.trace_saved_bytes imports it (and torch) only when called


def test_modules_follows_imports_but_not_those_inside_functions(tmp_path):
    (tmp_path / "a.py").write_text("import b\nfrom c import x\n\ndef f():\n    import d\n")
    (tmp_path / "b.py").write_text("import os\nimport c\n")
    (tmp_path / "c.py").write_text("x = 1\n")
    (tmp_path / "d.py").write_text("import torch\n")
    assert pyodide.modules("a.py", tmp_path) == ["a.py", "b.py", "c.py"]


def fake_npm(tmp_path, tarball: bytes):
    """An `npm` on PATH whose `pack` writes this tarball into --pack-destination."""
    (tmp_path / "pkg.tgz").write_bytes(tarball)
    npm = tmp_path / "bin" / "npm"
    npm.parent.mkdir()
    npm.write_text(f'#!/bin/sh\nwhile [ "$1" != "--pack-destination" ]; do shift; done\n'
                   f'cp {tmp_path / "pkg.tgz"} "$2/pyodide-{pyodide.VERSION}.tgz"\n')
    npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    return str(npm.parent)


def tarball(files: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_tarball_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_npm(tmp_path, tarball({n: b"x" for n in pyodide.RUNTIME})) + os.pathsep
                       + os.environ["PATH"])
    with pytest.raises(pyodide.Unavailable, match="does not match the pinned integrity"):
        pyodide.runtime(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_the_pinned_tarball_gives_only_the_core_files(tmp_path, monkeypatch):
    data = tarball({**{n: n.encode() for n in pyodide.RUNTIME}, "console.html": b"<html>"})
    monkeypatch.setattr(pyodide, "INTEGRITY", pyodide.integrity(data))
    monkeypatch.setenv("PATH", fake_npm(tmp_path, data) + os.pathsep + os.environ["PATH"])
    cache = pyodide.runtime(tmp_path / "cache")
    assert sorted(p.name for p in cache.iterdir()) == sorted([*pyodide.RUNTIME, "integrity"])
    assert (cache / "pyodide.mjs").read_bytes() == b"pyodide.mjs"
    (tmp_path / "bin" / "npm").unlink()  # a second build takes the cache and needs no npm
    assert pyodide.runtime(tmp_path / "cache") == cache


def test_without_npm_the_build_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(pyodide.shutil, "which", lambda name: None)
    with pytest.raises(pyodide.Unavailable, match="npm is not installed"):
        pyodide.runtime(tmp_path / "cache")


def test_an_unavailable_runtime_leaves_a_manifest_that_the_page_reads(tmp_path, monkeypatch):
    def unavailable():
        raise pyodide.Unavailable("npm pack failed")
    monkeypatch.setattr(pyodide, "runtime", unavailable)
    assert pyodide.stage(tmp_path / "stage") == "npm pack failed"
    manifest = json.loads((tmp_path / "stage" / "calculator" / "manifest.json").read_text())
    assert manifest["available"] is False and manifest["reason"] == "npm pack failed"
    assert not (tmp_path / "stage" / "pyodide").exists()
    assert sorted(p.name for p in (tmp_path / "stage" / "calculator" / "code").iterdir()) == pyodide.modules()
