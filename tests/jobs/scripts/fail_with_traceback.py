"""Fails with an uncaught exception: its traceback is the tail of stderr."""

import sys

for i in range(30):
    print(f"noise line {i}", file=sys.stderr)


def load() -> None:
    raise ValueError("the data is bad")


load()
