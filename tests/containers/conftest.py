"""A real container engine for the container backend's tests.

Podman's Docker-compatible service (``podman system service``) is started by the tests
on a socket of their own, with its storage in the test's folder and its configuration
written here, not in the system's: these machines need the ``runc`` runtime (crun fails
on them). Their hard limits are below what Podman asks for by default: shipyard asks
for no more than they allow (backends/containers.py, host_ulimits), and the engine is
left at its defaults so that this is tested. It is stopped by its PID at the end.

No registry is reachable, so the images are built here: a Debian root filesystem with
Python, made once with ``debootstrap`` and cached between runs (rootfs.py, which ``make
test`` runs before the tests), is imported as the base image, and the test images
are built on it through the engine's API, each a few lines around ``images/serve.py``
(the hosting contract) or ``images/train.py`` (the training contract).

Every test of the engine is in the xdist group ``engine``: one worker runs them all,
against one engine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.containers import rootfs

IMAGES = Path(__file__).parent / "images"
BASE_IMAGE = "localhost/shipyard-test/python:bookworm"
MISSING_TOOLS = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]

needs_engine = [
    pytest.mark.skipif(
        bool(MISSING_TOOLS) or os.geteuid() != 0,
        reason=f"the container tests need podman, runc and debootstrap as root "
        f"(missing: {', '.join(MISSING_TOOLS) or 'root'}); make install-dev installs them",
    ),
    pytest.mark.xdist_group("engine"),
]


@dataclass
class Engine:
    """The engine the tests run, and how to reach it."""

    host: str
    """DOCKER_HOST for a gateway that uses it."""
    client: Any
    """A ``docker`` client of the engine."""
    folder: Path

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.host}

    def build(self, tag: str, *, script: str = "serve.py", lines: tuple[str, ...] = ()) -> str:
        """An image ``tag`` built on the base image: ``script`` as its entry point, and
        ``lines`` (ENV, LABEL) of its Containerfile."""
        context = self.folder / "contexts" / tag.replace("/", "_").replace(":", "_")
        context.mkdir(parents=True, exist_ok=True)
        shutil.copy(IMAGES / script, context / script)
        (context / "Containerfile").write_text(
            "\n".join(
                [
                    f"FROM {BASE_IMAGE}",
                    f"COPY {script} /opt/program/{script}",
                    *lines,
                    f'ENTRYPOINT ["python3", "-u", "/opt/program/{script}"]',
                ]
            )
            + "\n"
        )
        self.client.images.build(path=str(context), dockerfile="Containerfile", tag=tag, rm=True)
        return tag

    def containers(self, **labels: str) -> list[Any]:
        """The engine's containers, running or not, that carry all of ``labels``."""
        from docker.errors import APIError

        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        found = []
        for listed in self.client.api.containers(all=True, filters=filters):
            with contextlib.suppress(APIError):  # removed since it was listed
                found.append(self.client.containers.get(listed["Id"]))
        return found


def _rootfs() -> Path:
    """The base image's root filesystem (rootfs.py; ``make test`` makes it first)."""
    made = rootfs.make()
    if not isinstance(made, Path):
        pytest.skip(made)
    return made


def _configuration(folder: Path) -> Path:
    """containers.conf for the test engine: runc, and the engine's default limits."""
    conf = folder / "containers.conf"
    conf.write_text('[engine]\nruntime = "runc"\nevents_logger = "file"\n')
    return conf


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    import docker

    rootfs = _rootfs()
    folder = tmp_path_factory.mktemp("engine")
    # Podman refuses a run root longer than 50 characters, and a socket's path must be
    # short: both go in a short folder of their own.
    short = Path(tempfile.mkdtemp(prefix="sy-engine-", dir="/tmp"))
    env = {**os.environ, "CONTAINERS_CONF": str(_configuration(folder))}
    podman = ["podman", "--root", str(folder / "root"), "--runroot", str(short / "run")]
    socket = short / "podman.sock"
    with open(folder / "service.log", "wb") as out:
        service = subprocess.Popen(
            [*podman, "system", "service", "--time=0", f"unix://{socket}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    client = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client = docker.DockerClient(base_url=f"unix://{socket}", timeout=120)
                client.ping()
                break
            except Exception:
                if client is not None:
                    client.close()
                    client = None
                if service.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "podman system service did not start: "
                        + (folder / "service.log").read_text(errors="replace")[-2000:]
                    ) from None
                time.sleep(0.1)
        subprocess.run(
            [*podman, "import", str(rootfs), BASE_IMAGE],
            env=env,
            check=True,
            capture_output=True,
        )
        yield Engine(host=f"unix://{socket}", client=client, folder=folder)
    finally:
        if client is not None:
            for container in client.containers.list(all=True):
                with contextlib.suppress(Exception):
                    container.remove(force=True)
            client.close()
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait()
        # The images go, and with them the storage's mounts; the folder goes with tmp_path.
        subprocess.run([*podman, "rmi", "--all", "--force"], env=env, capture_output=True)
        shutil.rmtree(short, ignore_errors=True)
