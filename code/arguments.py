"""Command-line arguments as every script of the book takes them: a wrong setting is one line on stderr.

Parser, number, positive, positive_int and fail give the same kind of message in every script (exit 2
for a bad argument, 1 for any other refusal), never a usage block or a traceback. Pure Python, no
torch: budget.py runs in the browser (chapter 7's calculator, under Pyodide) with these.
"""
import argparse
import math
import re
import sys


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one sentence, not the whole usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def fail(message: str):
    """Stop the script with one line on stderr, `error: message`, and exit status 1."""
    sys.exit(f"error: {message}")


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
