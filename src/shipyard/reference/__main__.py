"""``python -m shipyard.reference [FOLDER]``: write the reference pages (default
docs/reference)."""

from __future__ import annotations

import sys
from pathlib import Path

from shipyard.reference import write


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/reference")
    for path in write(folder):
        print(path)


if __name__ == "__main__":
    main()
