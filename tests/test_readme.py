"""The README names only what exists: every file or folder it names, every `python -m` module and every
pytest marker its commands use. (Its commands themselves are run by CI: command 2 is .ci/run's.)"""
import importlib.util
import re
import tomllib

import pytest

from bookbuild.book import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
MADE_BY_RUNNING = ("_build/", ".venv/", "data/cache/")  # what a build, an install or a first run makes
FOLDERS = ["", "code", "bookbuild", "tests", "data", "chapters", "_static"]  # where a bare file name may live


def named_paths():
    words = set(re.findall(r"`([^`\s]+)`", README))
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        words |= set(re.findall(r"[\w.-]*/[\w./-]+\.\w+", block))
    for word in sorted(words):
        word = word.rstrip(".,;:)")
        placeholder = "*" in word or "NN" in word or re.fullmatch(r"\.\w+", word)  # NN_*.md, `.ipynb`
        elsewhere = word.startswith(("/", "file:")) or "://" in word or word.startswith(MADE_BY_RUNNING)
        if placeholder or elsewhere or not re.fullmatch(r"[\w./-]+", word):
            continue
        if "/" in word or re.search(r"\.(py|md|ipynb|txt|yml|yaml|toml|cfg|js|css)$", word):
            yield word


@pytest.mark.parametrize("path", list(named_paths()))
def test_a_path_the_readme_names_exists(path):
    found = (REPO / path).exists() if "/" in path else any((REPO / f / path).exists() for f in FOLDERS)
    assert found, f"README.md names {path}, which is not in the repository"


@pytest.mark.parametrize("module", sorted(set(re.findall(r"python3? -m ([\w.]+)", README))))
def test_a_module_the_readme_runs_exists(module):
    assert importlib.util.find_spec(module) is not None, f"README.md runs `python -m {module}`, which does not exist"


def test_the_markers_the_readme_selects_are_declared():
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    declared = {line.split(":")[0] for line in config["markers"]}
    used = set(re.findall(r'-m "not (\w+)"', README))
    assert used and used <= declared, f"README.md selects markers {used}; pyproject.toml declares {declared}"
