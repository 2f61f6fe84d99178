"""Exercises a reader writes and a test checks against the book's own code (issue 30; how to do them:
README.md's "Exercises" section). checks.py and _worker.py hold the checks, test_yours.py runs them on
the reader's files, tests/test_exercises.py on solutions/, solutions/alt/ and wrong/."""
