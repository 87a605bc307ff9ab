"""The apps of bench/servers.py, for granian, which imports its target by name.

- ``granian_targets:runtime``: what ``python -m shipyard.runtime --model-dir
  $BENCH_MODEL_DIR`` serves, built by the same function (same handlers, same handler
  threads), so only the HTTP server differs.
- ``granian_targets:gateway``: what ``shipyard serve --home $BENCH_HOME`` serves
  (``create_app``: SQLite, the local backend; its instances still run uvicorn).

Built on first access, in granian's worker process: the runtime's handler threads start
in the process that uses them, and one module serves either app.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "runtime":
        from shipyard.runtime.__main__ import _app

        return _app(Path(os.environ["BENCH_MODEL_DIR"]), os.environ)
    if name == "gateway":
        from shipyard.app import create_app
        from shipyard.settings import Settings

        return create_app(Settings(home=Path(os.environ["BENCH_HOME"])))
    raise AttributeError(name)
