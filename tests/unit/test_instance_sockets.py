"""A built-in runtime instance on this host also serves on a Unix socket, and the
gateway's requests to it take that socket (backends/instance_sockets.py, http/client.py).

Real instance processes (plain, and in a bubblewrap sandbox where bwrap is installed),
real requests through the gateway's connection pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path

import pytest

from shipyard.backends.base import InstanceSpec
from shipyard.backends.local import LocalBackend, LocalInstance
from shipyard.backends.sandbox import Sandbox
from shipyard.routing.instance import Instance

pytestmark = pytest.mark.processes  # starts built-in runtime instances

ECHO = """
import os


def transform_fn(model, body, content_type, accept):
    if body.startswith(b"exists:"):  # what the instance sees at a path
        return str(os.path.lexists(body[7:].decode())), "text/plain"
    return b"echo:" + body, "text/plain"
"""


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(ECHO)
    return folder


@contextlib.asynccontextmanager
async def _serving(
    backend: LocalBackend, spec: InstanceSpec
) -> AsyncIterator[tuple[LocalInstance, Instance]]:
    """An instance started by ``backend``, once it answers ``/ping``, and the gateway's
    view of it; stopped (its pool closed) on the way out."""
    handle = await backend.start(spec)
    assert isinstance(handle, LocalInstance)
    instance = Instance(spec.instance_id, "v", handle.url, socket_path=handle.socket_path)
    try:
        for _ in range(600):
            with contextlib.suppress(Exception):
                if (await instance.pool.ping()).status == 200:
                    break
            assert handle.process.poll() is None, "the instance exited"
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the instance did not answer /ping within 30 s")
        yield handle, instance
    finally:
        instance.pool.close()
        await backend.stop(handle)


def _run(backend: LocalBackend, main: Callable[[], Coroutine[None, None, None]]) -> None:
    """``main`` on an event loop of its own, then ``backend`` closed whatever happened."""
    try:
        asyncio.run(main())
    finally:
        backend.close()


def _families(instance: Instance) -> set[int]:
    """The address families of the pool's idle connections."""
    return {
        conn.transport.get_extra_info("socket").family  # type: ignore[union-attr]
        for conn in instance.pool._idle
    }


async def _invoke(instance: Instance, body: bytes) -> bytes:
    response = await instance.pool.request(
        b"POST", b"/invocations", [(b"Content-Type", b"text/plain")], body
    )
    assert response.status == 200, response.body
    return response.body


def test_requests_take_the_instance_socket_and_go_on_over_tcp_without_it(
    tmp_path: Path, model: Path
) -> None:
    backend = LocalBackend(run_dir=tmp_path / "run")

    async def main() -> None:
        spec = InstanceSpec("i-1", "shipyard/python", model_url=str(model))
        async with _serving(backend, spec) as (handle, instance):
            assert handle.socket_path is not None
            path = Path(handle.socket_path)
            assert stat.S_ISSOCK(path.stat().st_mode)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            # The instance was handed the bound socket, not told where it lies.
            assert str(path) not in " ".join(handle.process.args)  # type: ignore[arg-type]

            answers = await asyncio.gather(*(_invoke(instance, b"%d" % n) for n in range(8)))
            assert answers == [b"echo:%d" % n for n in range(8)]
            assert _families(instance) == {socket.AF_UNIX}

            # The socket gone (say, its folder cleaned away): the pool goes on over TCP.
            instance.pool.close()
            path.unlink()
            assert await _invoke(instance, b"after") == b"echo:after"
            assert instance.pool.socket_path is None
            assert _families(instance) == {socket.AF_INET}
        assert not path.exists(), "a stopped instance's socket is removed"

    _run(backend, main)


def test_an_instance_from_a_warm_spare_is_handed_its_socket(tmp_path: Path, model: Path) -> None:
    """A spare was started before the socket existed: the socket travels to it with its
    work, over the socket pair the spare waits on."""
    backend = LocalBackend(run_dir=tmp_path / "run", warm_spares=1)

    async def main() -> None:
        backend.spares.refill()
        (spare_pid,) = backend.spares.pids()
        spec = InstanceSpec("i-4", "shipyard/python", model_url=str(model), warm=True)
        async with _serving(backend, spec) as (handle, instance):
            assert handle.process.pid == spare_pid, "the spare became the instance"
            assert handle.socket_path is not None
            assert await _invoke(instance, b"warm") == b"echo:warm"
            assert _families(instance) == {socket.AF_UNIX}

    _run(backend, main)


def test_a_cmd_server_is_reached_on_its_port_alone(tmp_path: Path) -> None:
    """A ``cmd:`` image's server listens where the container contract says, no more."""
    backend = LocalBackend(run_dir=tmp_path / "run")

    async def main() -> None:
        handle = await backend.start(InstanceSpec("i-2", "cmd:sleep 30"))
        try:
            assert handle.socket_path is None
        finally:
            await backend.stop(handle)

    _run(backend, main)


@pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="bubblewrap (bwrap) is not installed; make install-dev installs it",
)
def test_a_sandboxed_instance_serves_on_its_socket_too(tmp_path: Path, model: Path) -> None:
    sandbox = Sandbox.create(file_roots=[model], hidden=[tmp_path / "home"], environ=os.environ)
    backend = LocalBackend(run_dir=tmp_path / "home" / "run", sandbox=sandbox)

    async def main() -> None:
        spec = InstanceSpec("i-3", "shipyard/python", model_url=str(model))
        async with _serving(backend, spec) as (handle, instance):
            assert handle.socket_path is not None
            assert await _invoke(instance, b"boxed") == b"echo:boxed"
            assert _families(instance) == {socket.AF_UNIX}
            # The socket's folder is not shown in the sandbox: a model cannot put a link
            # there and send the gateway's connections somewhere else.
            folder = Path(handle.socket_path).parent
            assert await _invoke(instance, b"exists:" + str(folder).encode()) == b"False"
            assert await _invoke(instance, b"exists:/usr") == b"True"

    _run(backend, main)


def test_a_socket_path_too_long_for_an_address_leaves_tcp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(deep))
    backend = LocalBackend(run_dir=tmp_path / "run")
    try:
        assert backend.sockets.bind(12345) is None
    finally:
        backend.close()


FILLS_ITS_HOME = """
import os


def model_fn(model_dir):
    with open(os.path.join(os.environ["HOME"], "weights.cache"), "wb") as f:
        f.write(b"x" * 1_000_000)
    return None


def transform_fn(model, body, content_type, accept):
    return os.environ["HOME"], "text/plain"
"""

WRITES_A_HUGE_REASON = """
import sys


def model_fn(model_dir):
    where = sys.argv[sys.argv.index("--error-file") + 1]  # the reason the gateway reads
    with open(where, "w") as f:
        f.write("R" * 5_000_000)
    raise SystemExit(3)
"""


def test_an_instances_home_goes_with_it(tmp_path: Path) -> None:
    """The model fills $HOME as it likes; deleted endpoints must not leave it on the disk
    that holds the store."""
    folder = tmp_path / "model"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(FILLS_ITS_HOME)
    backend = LocalBackend(run_dir=tmp_path / "run")
    homes: list[Path] = []

    async def main() -> None:
        spec = InstanceSpec("i-home", "shipyard/python", model_url=str(folder))
        async with _serving(backend, spec) as (_, instance):
            homes.append(Path((await _invoke(instance, b"where")).decode()))
            assert (homes[0] / "weights.cache").stat().st_size == 1_000_000

    _run(backend, main)
    assert homes == [tmp_path / "run" / "home" / "i-home"] and not homes[0].exists()


def test_the_reason_an_instance_writes_is_read_in_its_first_kilobyte(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(WRITES_A_HUGE_REASON)
    backend = LocalBackend(run_dir=tmp_path / "run")

    async def main() -> None:
        handle = await backend.start(
            InstanceSpec("i-why", "shipyard/python", model_url=str(folder))
        )
        assert isinstance(handle, LocalInstance)
        try:
            await asyncio.to_thread(handle.process.wait, 60)
            reason = backend.exit_reason(handle)
            assert reason is not None and reason == "R" * 1024
        finally:
            await backend.stop(handle)

    _run(backend, main)
