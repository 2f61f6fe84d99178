"""What a reader copies to a rented box for code/train_gpu.py: the script and every module of code/ it
imports, followed to the end (imports inside functions included), with each file's lines.

    python -m bookbuild.copy_size

tests/test_train_gpu.py holds the docstring's copy list equal to these files and the copy within
MAX_FILES files and MAX_LINES lines. A module the chapters use that train_gpu.py does not import (memory.py,
train.py, measure.py) is not copied, however it imports the modules that are.
"""
from pathlib import Path

from .book import REPO
from .reads import named

CODE = REPO / "code"
MAX_FILES = 10
MAX_LINES = 3400  # the copy was 15 files and 3,720 lines before issue 38; the goal there was 2,500 (not reached)


def closure(entry: str = "train_gpu", code: Path = CODE) -> dict:
    """{file name: lines} of `entry`.py and every module of `code` it imports, directly or not."""
    seen, todo = {}, [entry]
    while todo:
        name = todo.pop()
        if f"{name}.py" in seen:
            continue
        text = (code / f"{name}.py").read_text(encoding="utf-8")
        seen[f"{name}.py"] = len(text.splitlines())
        todo += sorted(named(text, code)[0])  # the modules of code/ it imports
    return seen


def main() -> None:
    files = closure()
    for name, lines in sorted(files.items(), key=lambda kv: -kv[1]):
        print(f"{lines:6,d}  code/{name}")
    print(f"{sum(files.values()):6,d}  in {len(files)} files (at most {MAX_LINES:,} lines in {MAX_FILES} files)")


if __name__ == "__main__":
    main()
