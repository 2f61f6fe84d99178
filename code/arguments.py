"""Command-line arguments as every script of the book takes them: a wrong setting is one line on stderr.

Parser, number, positive, positive_int and fail give the same kind of message in every script, never a
usage block or a traceback, and the same exit status: BAD_ARGUMENT (2, argparse's own) for a bad
argument, REFUSED (1) for any other refusal. run_main runs a script's main as its command line would,
capturing what it prints. Pure Python, no torch: budget.py runs in the browser (chapter 12's
calculator, under Pyodide) with these.
"""
import argparse
import contextlib
import io
import math
import re
import sys
from typing import NoReturn

BAD_ARGUMENT = 2  # what argparse exits with for a usage error, and fail() for any other bad argument
REFUSED = 1       # anything else a script refuses to do: no corpus, no GPU, a failed run


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one sentence, not the whole usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def fail(message: str, status: int = BAD_ARGUMENT) -> NoReturn:
    """Stop the script with one line on stderr, `error: message`, and exit status 2 (a bad argument), or
    REFUSED for a refusal that no argument can fix."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def refuse(message: str) -> NoReturn:
    """fail() with REFUSED: a bad file, setting or state that no argument's syntax can fix (exit 1)."""
    fail(message, REFUSED)


def run_main(main, argv: list) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of main(argv), as its command line would show them."""
    out, err, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:  # what the interpreter does with it: a number is the status, text goes to stderr
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            status = e.code if isinstance(e.code, int) else 0 if e.code is None else REFUSED
    return status, out.getvalue(), err.getvalue()


def number(text: str) -> float:
    """1e9, 1.3B, 124M, 20k -> float; anything else is an argparse error."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    return float(m.group(1)) * scale


def positive(text: str) -> float:
    """An argparse type: a finite number above zero, with the suffixes number() accepts."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} is negative; it must be positive")
    value = number(text)
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero (2e3 and 2k are 2000)."""
    value = positive(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number")
    return int(value)


def non_negative(text: str) -> float:
    """An argparse type: a finite number, zero or above (not nan, not inf)."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} is negative; it must be 0 or more")
    return 0.0 if number(text) == 0 else positive(text)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number, zero or above."""
    value = non_negative(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number")
    return int(value)


def fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    value = non_negative(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie between 0 and 1")
    return value
