"""``python -m shipyard.runtime``: load the model, then serve it.

The only place in the runtime that reads the environment (``SAGEMAKER_PROGRAM``) or
exits: :mod:`~shipyard.runtime.handlers` and :mod:`~shipyard.runtime.server` raise.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from shipyard.runtime import handlers, server

log = logging.getLogger("shipyard.runtime")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m shipyard.runtime",
        description="Serve one model with the SageMaker container contract.",
    )
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--model-dir", type=Path, required=True, help="the extracted artifact")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--error-file", type=Path, help="where to write '<ExcType>: <message>' if start fails"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the runtime until it is stopped; the process exit code."""
    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        loaded = handlers.load(args.model_dir, program=os.environ.get("SAGEMAKER_PROGRAM"))
        sock = server.bind(args.host, args.port)
    except Exception as exc:
        log.exception("could not start the model in %s", args.model_dir)
        if args.error_file is not None:
            _write_reason(args.error_file, exc)
        return 1
    log.info("serving %r on %s:%s", loaded, args.host, args.port)
    server.serve(loaded, sock)
    return 0


def _write_reason(path: Path, exc: Exception) -> None:
    # One line: the gateway copies it into FailureReason as it is.
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    name = type(exc).__name__
    try:
        path.write_text(f"{name}: {text}\n" if text else f"{name}\n")
    except OSError:
        log.exception("could not write the error file %s", path)


if __name__ == "__main__":
    sys.exit(main())
