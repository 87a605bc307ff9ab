"""What an instance does first, on its own host: fetch its model artifact.

A backend hands an instance the artifact's URI (``InstanceSpec.model_url``), never a
folder on the gateway's disk, so an instance on another machine needs nothing from the
gateway but its spec. The built-in runtime calls :func:`model_folder` before it loads the
model; a ``cmd:`` server is started through ``python -m shipyard.launch``, which fetches
the artifact, enters its folder, sets ``SM_MODEL_DIR`` and then becomes the user's
command (``exec``: same PID, so the backend stops it as before).

Artifacts are kept under a cache folder per host, one slot per URI: instances of one
model share one copy, fetched once (storage/artifacts.py takes turns on a lock file).

    python -m shipyard.launch (--model-url URI --model-cache DIR | --model-dir DIR)
                              [--error-file F] -- CMD...
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shipyard.storage.artifacts import ArtifactStore

log = logging.getLogger("shipyard.launch")


def model_folder(
    url: str | None,
    cache: Path,
    *,
    s3_endpoint_url: str | None = None,
    store: ArtifactStore | None = None,
) -> Path:
    """The folder holding the artifact at ``url``, fetched into ``cache`` if needed.

    No URL: an empty folder (a model directory with no files, which the built-in runtime
    serves as an echo). ``store``: the gateway's (``auth.file_roots`` enforced), for a
    fetch it makes on an instance's behalf; by default one with no roots, for an
    instance's own fetch. Raises ArtifactError as ArtifactStore.fetch_model.
    """
    if not url:
        empty = cache / "_empty"
        empty.mkdir(parents=True, exist_ok=True)
        return empty
    slot = cache / hashlib.sha256(url.encode()).hexdigest()[:16]
    if store is None:
        # Imported here: s3fs is heavy, and a cmd: server's start should not pay for it twice.
        from shipyard.storage.artifacts import ArtifactStore

        store = ArtifactStore(s3_endpoint_url=s3_endpoint_url)
    return store.fetch_model(url, slot)


MODEL_CODE = "/opt/ml/model/code"
"""What the SDK sets SAGEMAKER_SUBMIT_DIRECTORY to when the code is inside the model."""


def code_folder(uri: str | None, cache: Path, *, s3_endpoint_url: str | None = None) -> Path | None:
    """The folder of a framework model's code (``SAGEMAKER_SUBMIT_DIRECTORY``), fetched.

    The sagemaker SDK uploads ``sourcedir.tar.gz`` and names it here (s3://, file://, a
    path), or says ``/opt/ml/model/code``: the model's own ``code/``, for which None is
    returned. An archive is extracted through the same filter as model artifacts (no
    path escapes, no links out). Raises ArtifactError as ArtifactStore.fetch_code.
    """
    if not uri or uri.rstrip("/") == MODEL_CODE:
        return None
    from shipyard.storage.artifacts import ArtifactStore

    slot = cache / ("code-" + hashlib.sha256(uri.encode()).hexdigest()[:16])
    return ArtifactStore(s3_endpoint_url=s3_endpoint_url).fetch_code(uri, slot)


def install_requirements(code_dir: Path) -> Path | None:
    """``pip install -r requirements.txt`` of ``code_dir`` into a folder beside it, which
    is returned to be put on the import path; None without a requirements file.

    Opt-in (``SHIPYARD_INSTALL_REQUIREMENTS=true`` in the model's Environment): it reaches
    the package index from the instance's host and runs the packages' build code. The
    folder is kept with the code, so instances of one model install once.

    Raises:
        RuntimeError: pip failed; its last lines say why.
    """
    requirements = code_dir / "requirements.txt"
    if not requirements.is_file():
        return None
    target = code_dir.parent / (code_dir.name + ".packages")
    marker = target / ".installed"
    # Instances of one model take turns: the first installs, the others find it done.
    with open(code_dir.parent / (code_dir.name + ".packages.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return target
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        argv += ["--target", str(target), "-r", str(requirements)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise RuntimeError(f"pip could not install {requirements.name}: {tail}")
        marker.touch()
    return target


def write_reason(
    path: Path | None, exc: BaseException, *, fetched: dict[Path, str] | None = None
) -> None:
    """One line ``<ExcType>: <message>`` in ``path``: the backend's exit reason, which the
    gateway copies into FailureReason as it is.

    The user knows the model by its ModelDataUrl (and its code by its submit directory),
    not by the folders this host fetched them to: each folder of ``fetched`` named in the
    message is replaced by the URI it was fetched from.
    """
    if path is None:
        return
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    for folder, uri in (fetched or {}).items():
        text = text.replace(str(folder), uri.rstrip("/"))
    name = type(exc).__name__
    try:
        path.write_text(f"{name}: {text}\n" if text else f"{name}\n")
    except OSError:
        log.exception("could not write the error file %s", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shipyard.launch")
    parser.add_argument("--model-url", default=None, help="the artifact to fetch, if any")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model-cache", type=Path, help="the artifact cache folder")
    where.add_argument("--model-dir", type=Path, help="a model folder to use as it is")
    parser.add_argument("--error-file", type=Path, help="where to write why the start failed")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    try:
        folder = args.model_dir or model_folder(
            args.model_url,
            args.model_cache,
            s3_endpoint_url=os.environ.get("SHIPYARD_S3_ENDPOINT_URL") or None,
        )
    except Exception as exc:
        log.exception("could not fetch the model at %s", args.model_url)
        write_reason(args.error_file, exc)
        return 1
    os.chdir(folder)
    os.environ["SM_MODEL_DIR"] = str(folder)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        write_reason(args.error_file, exc)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
