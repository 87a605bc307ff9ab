"""``python -m shipyard.runtime``: load the model, then serve it.

The only place in the runtime that reads the environment or exits: the other modules
take plain values and raise. Single-model mode reads ``SAGEMAKER_PROGRAM``; with
``SAGEMAKER_MULTI_MODEL=true`` (what SageMaker sets) the instance serves every model under
a prefix instead, loaded on demand, configured by:

- ``SHIPYARD_MODEL_PREFIX``: file:// URI, path or s3:// prefix; default ``--model-dir``.
- ``SHIPYARD_MODEL_CACHE_BYTES``: memory budget; default a quarter of MemTotal.
- ``SHIPYARD_MODEL_CACHE_MAX_MODELS``: at most this many models in memory; default none.
- ``SHIPYARD_MODEL_DISK_CACHE_BYTES``: fetched artifacts kept on disk; default 10 GiB.
- ``SHIPYARD_MODEL_CACHE_DIR``: where they are kept; default ``<model-dir>/.mme-cache``.
- ``SHIPYARD_MODEL_LOAD_WAIT_S``: how long a request waits for a load; default 50.
- ``SHIPYARD_S3_ENDPOINT_URL``: an S3-compatible endpoint for s3:// prefixes.

In both modes ``SAGEMAKER_MODEL_SERVER_WORKERS`` (default 1) says how many handler calls
run at once: one runs on the event loop, more on that many threads, and ``/ping`` answers
while they run either way (:mod:`shipyard.runtime.workers`);
``SHIPYARD_MAX_BATCH_SIZE`` with ``SHIPYARD_MAX_BATCH_DELAY_MS`` (default 10) turn on
server-side batching (:mod:`shipyard.runtime.batching`): for the model, which must define
``predict_batch_fn``, or in multi-model mode for each model that defines it.

``SHIPYARD_TASK`` (``text-generation`` or ``embeddings``) serves the model folder with a
ready handler instead of a program (:mod:`shipyard.runtime.tasks`); for text generation
``SHIPYARD_MAX_BATCH_SIZE`` is how many sequences are decoded together.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from shipyard import heap, launch
from shipyard.runtime import handlers, server, spare, tasks, workers
from shipyard.runtime.adapters import Adapters
from shipyard.runtime.batching import DEFAULT_MAX_DELAY_MS, BatchConfig
from shipyard.runtime.multimodel import DEFAULT_LOAD_WAIT_S

if TYPE_CHECKING:
    from shipyard.runtime import model_source

N = TypeVar("N", int, float)

log = logging.getLogger("shipyard.runtime")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m shipyard.runtime",
        description="Serve one model with the SageMaker container contract.",
    )
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-dir", type=Path, help="the extracted artifact")
    where.add_argument(
        "--model-url", help="the artifact to fetch first (s3://, file://, a path); see launch.py"
    )
    parser.add_argument(
        "--model-cache", type=Path, help="where --model-url is fetched to (default: a temp dir)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--unix-socket-fd",
        type=int,
        help="also serve on this bound Unix socket, inherited (the gateway's way in)",
    )
    parser.add_argument(
        "--adapters-token-fd",
        type=int,
        help="read the token /adapters requires from this inherited pipe (an inference "
        "component's copy); without it the instance has no /adapters route",
    )
    parser.add_argument(
        "--error-file", type=Path, help="where to write '<ExcType>: <message>' if start fails"
    )
    return parser.parse_args(argv)


def _adapters_token(fd: int | None) -> str:
    """The token a component's copy was handed on the pipe ``fd``; ``""`` without one.
    Never from the environment, which the model's code and a caller's Environment
    share: a variable of that name there turns on nothing."""
    if fd is None:
        return ""
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read(4096).decode().strip()


def main(argv: list[str] | None = None) -> int:
    """Run the runtime until it is stopped; the process exit code."""
    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    cache: Path = args.model_cache or Path(tempfile.mkdtemp(prefix="shipyard-model-"))
    fetched: dict[Path, str] = {}  # host folder -> the URI the user gave
    sock = unix_sock = None
    try:
        # The port first: the gateway chose it free a moment ago, and a model that takes
        # seconds to load would leave it free for another process to take meanwhile.
        sock = server.bind(args.host, args.port)
        if args.unix_socket_fd is not None:
            try:
                unix_sock = server.unix_listener(args.unix_socket_fd)
            except (OSError, ValueError) as exc:
                # The gateway then reaches the instance on its port (http/client.py).
                log.warning("not serving on the Unix socket given: %s", exc)
        model_dir: Path = args.model_dir or _fetch(args.model_url, cache, os.environ)
        if args.model_url:
            fetched[model_dir] = args.model_url
        code_dir = _code_dir(cache, os.environ)
        if code_dir is not None:
            fetched[code_dir] = os.environ["SAGEMAKER_SUBMIT_DIRECTORY"]
        app = _app(model_dir, os.environ, code_dir, _adapters_token(args.adapters_token_fd))
        spare.record_imports(os.environ)
    except Exception as exc:
        log.exception("could not start the model in %s", args.model_dir or args.model_url)
        launch.write_reason(args.error_file, exc, fetched=fetched)
        for bound in (sock, unix_sock):
            if bound is not None:
                bound.close()
        return 1
    heap.settle()  # the model is loaded: later collections need not walk it
    log.info("serving %r on %s:%s", app, args.host, args.port)
    server.serve(app, sock, unix_sock)
    return 0


def _fetch(url: str, cache: Path, environ: Mapping[str, str]) -> Path:
    s3_endpoint_url = environ.get("SHIPYARD_S3_ENDPOINT_URL") or None
    return launch.model_folder(url, cache, s3_endpoint_url=s3_endpoint_url)


def _code_dir(cache: Path, environ: Mapping[str, str]) -> Path | None:
    """A framework model's code: ``SAGEMAKER_SUBMIT_DIRECTORY`` fetched, put on the import
    path with its requirements when ``SHIPYARD_INSTALL_REQUIREMENTS`` is true."""
    code_dir = launch.code_folder(
        environ.get("SAGEMAKER_SUBMIT_DIRECTORY"),
        cache,
        s3_endpoint_url=environ.get("SHIPYARD_S3_ENDPOINT_URL") or None,
    )
    if code_dir is not None and environ.get("SHIPYARD_INSTALL_REQUIREMENTS", "").lower() == "true":
        packages = launch.install_requirements(code_dir)
        if packages is not None:
            sys.path.insert(0, str(packages))
    return code_dir


def _app(
    model_dir: Path,
    environ: Mapping[str, str],
    code_dir: Path | None = None,
    adapters_token: str = "",
) -> server.App:
    program = environ.get("SAGEMAKER_PROGRAM")
    count = _number(environ, "SAGEMAKER_MODEL_SERVER_WORKERS", int) or 1
    threads = workers.runner(count)
    batching = _batching(environ)
    multi_model = environ.get("SAGEMAKER_MULTI_MODEL", "").strip().lower() == "true"
    task = environ.get("SHIPYARD_TASK", "").strip()
    if task:
        if multi_model:
            raise ValueError("SHIPYARD_TASK serves one model: it cannot be a multi-model one.")
        return _task_app(tasks.check(task), model_dir, count, batching)
    if not multi_model:
        loaded = handlers.load(model_dir, program=program, code_dir=code_dir)
        # Only a copy of an inference component takes adapters, from whoever holds its
        # token (the gateway): the route fetches and runs code.
        adapters = None
        if adapters_token:
            adapters = Adapters(
                loaded,
                model_dir,
                Path(tempfile.gettempdir()) / f"shipyard-adapters-{os.getpid()}",
                token=adapters_token,
                s3_endpoint_url=environ.get("SHIPYARD_S3_ENDPOINT_URL") or None,
            )
        return server.RuntimeApp(
            loaded,
            threads=threads,
            batching=batching,
            adapters=adapters,
            bidi_max_streams=_number(environ, "SHIPYARD_BIDI_MAX_STREAMS", int) or 100,
        )
    # Imported here: s3fs and the artifact store are for multi-model instances only.
    from shipyard.runtime import model_contract, model_source

    config = _multi_model_config(model_dir.absolute(), environ, program, code_dir)
    cache = model_source.open_model_cache(config)
    return model_contract.MultiModelApp(cache, threads=threads, batching=batching)


def _task_app(task: str, model_dir: Path, count: int, batching: BatchConfig | None) -> server.App:
    """A ready handler's app (runtime/tasks). Text generation batches its own decoding
    steps, so it takes as many requests at once as a batch holds, each waiting for its
    tokens on a thread of its own; embeddings are batched by the runtime's batcher."""
    size = batching.max_size if batching is not None else 1
    delay_s = batching.max_delay_s if batching is not None else 0.0
    loaded = tasks.load(task, model_dir, max_batch_size=size, max_delay_s=delay_s)
    if task == tasks.TEXT_GENERATION:
        return server.RuntimeApp(loaded, threads=workers.HandlerThreads(max(size, count)))
    return server.RuntimeApp(loaded, threads=workers.runner(count), batching=batching)


def _batching(environ: Mapping[str, str]) -> BatchConfig | None:
    size = _number(environ, "SHIPYARD_MAX_BATCH_SIZE", int)
    delay = environ.get("SHIPYARD_MAX_BATCH_DELAY_MS", "").strip()
    if size is None:
        if delay:
            raise ValueError(
                "SHIPYARD_MAX_BATCH_DELAY_MS is set without SHIPYARD_MAX_BATCH_SIZE: "
                "set the batch size to turn batching on."
            )
        return None
    try:
        delay_ms = float(delay) if delay else DEFAULT_MAX_DELAY_MS
    except ValueError:
        raise ValueError(f"SHIPYARD_MAX_BATCH_DELAY_MS must be a number, got {delay!r}.") from None
    return BatchConfig(max_size=size, max_delay_s=delay_ms / 1000)


def _multi_model_config(
    model_dir: Path, environ: Mapping[str, str], program: str | None, code_dir: Path | None
) -> model_source.MultiModelConfig:
    from shipyard.runtime import model_source

    memory_budget_bytes = _number(environ, "SHIPYARD_MODEL_CACHE_BYTES", int)
    load_wait_timeout_s = _number(environ, "SHIPYARD_MODEL_LOAD_WAIT_S", float)
    return model_source.MultiModelConfig(
        prefix=environ.get("SHIPYARD_MODEL_PREFIX") or str(model_dir),
        memory_budget_bytes=memory_budget_bytes or model_source.total_memory_bytes() // 4,
        cache_dir=Path(environ.get("SHIPYARD_MODEL_CACHE_DIR") or model_dir / ".mme-cache"),
        max_models=_number(environ, "SHIPYARD_MODEL_CACHE_MAX_MODELS", int),
        disk_cache_bytes=(
            _number(environ, "SHIPYARD_MODEL_DISK_CACHE_BYTES", int)
            or model_source.DEFAULT_DISK_CACHE_BYTES
        ),
        s3_endpoint_url=environ.get("SHIPYARD_S3_ENDPOINT_URL") or None,
        load_wait_timeout_s=load_wait_timeout_s or DEFAULT_LOAD_WAIT_S,
        program=program,
        code_dir=code_dir,
    )


def _number(environ: Mapping[str, str], name: str, kind: Callable[[str], N]) -> N | None:
    """The positive number in ``environ[name]``; None when unset or empty."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not value > 0:
        raise ValueError(f"{name} must be a number above 0, got {text!r}.")
    return value


def spare_main(argv: list[str]) -> int:
    """``--spare [--preload-file F]``: import ahead, then serve what the backend sends."""
    parser = argparse.ArgumentParser(prog="python -m shipyard.runtime --spare")
    parser.add_argument("--preload-file", type=Path, help="modules to import, one a line")
    args = parser.parse_args(argv)
    return main(spare.wait_for_work(args.preload_file))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--spare"]:
        sys.exit(spare_main(sys.argv[2:]))
    sys.exit(main())
