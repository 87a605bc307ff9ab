"""Shared fixtures: real gateways on loopback, boto3 clients, model artifacts."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import psutil
import pytest
from moto.server import ThreadedMotoServer

from shipyard import autogroup
from tests.scheduling import pytest_collection_modifyitems  # noqa: F401  (a hook)

MODELS = Path(__file__).parent / "models"
PG_URL = os.environ.get("SHIPYARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass
class PgSchema:
    """A fresh schema on the machine's PostgreSQL; ``url`` points a store or gateway at it."""

    url: str
    name: str
    admin: Any
    """A SQLAlchemy engine on the database, to look inside from a test."""


@functools.cache
def pg_unreachable() -> str | None:
    """Why PostgreSQL at ``PG_URL`` cannot be used, or None when it can; asked once."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(
        PG_URL.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"connect_timeout": 5},
    )
    try:
        with engine.connect():
            return None
    except Exception as exc:
        cause = getattr(exc, "orig", None) or exc  # the driver's error, not SQLAlchemy's
        return str(cause).strip().splitlines()[0]
    finally:
        engine.dispose()


@pytest.fixture
def pg_schema() -> Iterator[PgSchema]:
    """A fresh PostgreSQL schema, dropped afterwards.

    Where PostgreSQL is absent the test skips, saying so, rather than running on SQLite
    and passing for a check it never made. SHIPYARD_TEST_PG points at another server.
    """
    import sqlalchemy

    if (reason := pg_unreachable()) is not None:
        pytest.skip(f"PostgreSQL is not reachable at {PG_URL} (set SHIPYARD_TEST_PG): {reason}")
    name = f"t_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(PG_URL.replace("postgresql://", "postgresql+psycopg://"))
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {name}"))
    yield PgSchema(f"{PG_URL}?options=-csearch_path%3D{name}", name, admin)
    with admin.begin() as conn:
        conn.execute(sqlalchemy.text(f"DROP SCHEMA {name} CASCADE"))
    admin.dispose()


def python_output(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter (as a process's start runs it)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GatewayProcess:
    """A gateway started as a real process; stopped by its PID."""

    url: str
    home: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def client(self, service: str, **kwargs: Any) -> Any:
        config = botocore.config.Config(
            retries={"max_attempts": kwargs.pop("max_attempts", 3), "mode": "standard"},
            read_timeout=kwargs.pop("read_timeout", 70),
            parameter_validation=kwargs.pop("config_validation", True),
        )
        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            config=config,
            **kwargs,
        )

    # One client of each per gateway: building one costs about 10 ms of CPU (botocore
    # makes a class of the service's operations), and wait loops read these every poll.
    # A botocore client may be shared between threads.
    @functools.cached_property
    def sm(self) -> Any:
        return self.client("sagemaker")

    @functools.cached_property
    def rt(self) -> Any:
        return self.client("sagemaker-runtime")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 40) -> int:
        """Stop the gateway by its PID, then any instance it left behind (after SIGKILL)."""
        from tests.e2e.processes import alive, instance_pids

        instances = instance_pids(self.process.pid) if self.process.poll() is None else []
        self._stop_gateway(sig, timeout_s)
        for pid in instances:
            if alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        return self.process.returncode

    def _stop_gateway(self, sig: int, timeout_s: float) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_gateway(
    home: Path,
    *,
    extra_env: dict[str, str] | None = None,
    args: list[str] | None = None,
    scheme: str = "http",
    answers: Callable[[GatewayProcess], bool] | None = None,
) -> GatewayProcess:
    """Start a gateway on a free port; ready once it listens there *and* ``answers``
    (by default: its /healthz says 200).

    A port found free may be taken before the gateway binds it (by another test's server,
    or another gateway started at the same moment). Then our gateway exits with "address
    already in use" while the other process answers: readiness counts only a listening
    socket of the gateway's own process, and a lost race starts again on another port.
    """
    for _ in range(3):
        gw = _launch_gateway(home, extra_env, args, scheme)
        if (outcome := _wait_ready(gw, answers or _healthy)) == "ready":
            return gw
        if outcome != "port taken":
            raise RuntimeError(f"gateway {outcome}:\n{gw.log()}")
    raise RuntimeError(f"gateway lost the race for a free port three times:\n{gw.log()}")


def _healthy(gw: GatewayProcess) -> bool:
    return gw.get("/healthz")[0] == 200


def _launch_gateway(
    home: Path, extra_env: dict[str, str] | None, args: list[str] | None, scheme: str
) -> GatewayProcess:
    port = free_port()
    env = {**os.environ, "SHIPYARD_HEALTH_CHECK_PERIOD_S": "0.5", **(extra_env or {})}
    log_path = home / f"gateway-{port}.log"
    home.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shipyard",
                "serve",
                "--port",
                str(port),
                "--home",
                str(home),
                *(args or []),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return GatewayProcess(f"{scheme}://127.0.0.1:{port}", home, process, log_path, env)


def _wait_ready(gw: GatewayProcess, answers: Callable[[GatewayProcess], bool]) -> str:
    """ "ready", "port taken" (exited, its port in use), or why it is not ready."""
    port = int(gw.url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if gw.process.poll() is not None:
            taken = "address already in use" in gw.log().lower()
            return "port taken" if taken else "exited early"
        if _listens(gw.process.pid, port):
            try:
                if answers(gw):
                    return "ready"
            except OSError:
                pass
        time.sleep(0.05)
    gw.stop(signal.SIGKILL)
    return "did not become ready"


def _listens(pid: int, port: int) -> bool:
    try:
        sockets = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets)


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def create(home: Path | None = None, **kwargs: Any) -> GatewayProcess:
        gw = start_gateway(home or tmp_path / "home", **kwargs)
        started.append(gw)
        return gw

    yield create
    for gw in started:
        gw.stop()
    for gw in started:
        stop_job_processes(gw.home)


def stop_job_processes(home: Path) -> None:
    """Kill by PID the job runners and scripts a test left behind; jobs outlive gateways.

    A PID counts only while its process is the one its file names (a PID may have been
    reused): a script runs in its attempt's folder, and a runner names that folder on its
    command line, as the gateway itself tells its runners (backends/local_jobs.py)."""
    pid_files = [*home.glob("jobs/*/attempt-*/*.pid"), *home.glob("processing/*/attempt-*/*.pid")]
    for pid_file in sorted(pid_files):
        folder = str(pid_file.parent)
        try:
            pid = int(pid_file.read_text().strip())
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
        if cwd.startswith(folder) or folder in argv:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)  # not a group's leader
    # A sandboxed runner's PID files hold the PIDs it has inside its sandbox; the bwrap
    # around it is recorded beside its folder (backends/local_jobs.py), with its start time
    # against a reused PID. Its group goes, and with the sandbox's end, what ran in it.
    for record in sorted(home.glob("jobs/*/attempt-*.sandbox")):
        try:
            recorded = json.loads(record.read_text())
            pid, started = int(recorded["pid"]), recorded["started"]
            if psutil.Process(pid).create_time() != started:
                continue
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            continue
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def wait_until(check: Callable[[], object], what: str, timeout_s: float = 30) -> None:
    """Poll ``check`` until it is true; fail naming ``what`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.02)


async def wait_until_async(check: Callable[[], object], what: str, timeout_s: float = 10) -> None:
    """``wait_until`` inside a test's own event loop: the loop's other tasks run between
    checks, so ``check`` sees them make progress."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        await asyncio.sleep(0.001)


def post_expecting_continue(port: int, path: str, body: bytes) -> tuple[bytes, bytes]:
    """POST ``body`` (JSON) to ``127.0.0.1:port`` with ``Expect: 100-continue`` over a
    raw socket: asserts the interim ``100`` comes before the body is sent, then returns
    the final answer's head and its body (read to its Content-Length)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 100 ")  # the body is still unsent
        sock.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        head, _, payload = answer.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(payload) < length:
            chunk = sock.recv(65536)
            assert chunk, answer
            payload += chunk
    return head, payload


def in_flight(gw: GatewayProcess, endpoint: str, variant: str = "v1") -> float:
    """The gateway's shipyard_requests_in_flight for one variant (0 when not listed)."""
    status, body = gw.get("/metrics")
    assert status == 200
    prefix = f'shipyard_requests_in_flight{{endpoint="{endpoint}",variant="{variant}"}} '
    for line in body.decode().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def undispatched_events(gw: GatewayProcess) -> int:
    """Events in a SQLite gateway's outbox not yet dispatched to every subscriber."""
    with sqlite3.connect(gw.home / "shipyard.db") as db:
        row = db.execute("SELECT count(*) FROM events WHERE dispatched_at IS NULL").fetchone()
    return int(row[0])


def wait_dispatched(gw: GatewayProcess, timeout_s: float = 30) -> None:
    """Until every event the gateway recorded is dispatched. From then on nothing more is
    sent for them, so a test can count what arrived instead of sleeping for "no more"."""
    deadline = time.monotonic() + timeout_s
    while (pending := undispatched_events(gw)) > 0:
        assert time.monotonic() < deadline, f"{pending} events still to dispatch"
        time.sleep(0.05)


@pytest.fixture
def gateway(gateway_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gateway_factory()


def make_tarball(model: str, dest: Path) -> Path:
    """Pack tests/models/<model> as a SageMaker model.tar.gz."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(MODELS / model, arcname=".")
    return dest


@pytest.fixture
def model_tarball(tmp_path: Path) -> Callable[[str], str]:
    def create(model: str) -> str:
        return make_tarball(model, tmp_path / "artifacts" / model / "model.tar.gz").as_uri()

    return create


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def deploy(
    sm: Any,
    name: str,
    model_url: str,
    *,
    count: int = 1,
    strategy: str = "RANDOM",
    image: str = "shipyard/python",
    environment: dict[str, str] | None = None,
    wait: bool = True,
    variants: list[dict[str, Any]] | None = None,
    async_config: dict[str, Any] | None = None,
) -> None:
    """Create model, config and endpoint called ``name`` and wait until InService."""
    container: dict[str, Any] = {"Image": image, "ModelDataUrl": model_url}
    if environment:
        container["Environment"] = environment
    sm.create_model(
        ModelName=name,
        PrimaryContainer=container,
        ExecutionRoleArn="arn:aws:iam::123456789012:role/x",
    )
    extra: dict[str, Any] = {"AsyncInferenceConfig": async_config} if async_config else {}
    sm.create_endpoint_config(
        EndpointConfigName=name,
        **extra,
        ProductionVariants=variants
        or [
            {
                "VariantName": "v1",
                "ModelName": name,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": count,
                "RoutingConfig": {"RoutingStrategy": strategy},
            }
        ],
    )
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    if wait:
        wait_in_service(sm, name)


def wait_in_service(sm: Any, name: str) -> None:
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


# -- S3 (moto's server stands in for AWS itself, which cannot run here) ---------------


@dataclass
class Bucket:
    """A fresh bucket on the moto server, and a boto3 client to fill it."""

    name: str
    endpoint_url: str
    client: Any

    def put(self, key: str, body: bytes | Path) -> str:
        """Upload ``body`` (bytes, or a file's content) to ``key``; return its s3:// URI."""
        data = body.read_bytes() if isinstance(body, Path) else body
        self.client.put_object(Bucket=self.name, Key=key, Body=data)
        return f"s3://{self.name}/{key}"


@pytest.fixture(scope="module")
def s3_endpoint_url() -> Iterator[str]:
    """A moto S3 server on a free loopback port, once per test module.

    AWS itself cannot run here, so moto stands in for it, spoken to over real HTTP.
    """
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_endpoint_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Bucket:
    """A new, empty bucket, with fake credentials in the environment for every client."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # Keep the developer's own AWS profile and config out of the tests.
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    client = boto3.client("s3", endpoint_url=s3_endpoint_url)
    name = f"models-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return Bucket(name=name, endpoint_url=s3_endpoint_url, client=client)


# -- notification receivers -----------------------------------------------------------


@pytest.fixture
def webhook() -> Iterator[Any]:
    """A real webhook receiver on loopback (tests.listeners.WebhookListener)."""
    from tests.listeners import WebhookListener

    listener = WebhookListener()
    yield listener
    listener.close()


@pytest.fixture
def smtp() -> Iterator[Any]:
    """A real SMTP server on loopback, no TLS or login (tests.listeners.SmtpListener)."""
    from tests.listeners import SmtpListener

    listener = SmtpListener()
    yield listener
    listener.close()


def _autogroups_settable() -> bool:
    """Whether this kernel lets a process set its autogroup's nice value (not only shows
    it): set to what it is."""
    now = autogroup.nice()
    return now is not None and autogroup.set_nice("self", now, 1.0)


needs_autogroups = pytest.mark.skipif(
    not _autogroups_settable(), reason="the kernel has no autogroups to set"
)
