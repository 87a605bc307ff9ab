"""Container images, run through the Docker Engine API (Docker, or Podman's compatible
service), honouring SageMaker's hosting contract (``<image> serve``, ``/ping``, ``/invocations``).

An instance of an image is one engine container: ``<image> serve``, its model artifact
(fetched and extracted once on the gateway's host, into the same cache the local
backend uses) bound read-only at ``/opt/ml/model``, its ``Environment`` and nothing of
the gateway's, port 8080 (or ``SAGEMAKER_BIND_TO_PORT``, for an image whose label says
it accepts one) published on a loopback port the router sends requests to, and its
InstanceType's vCPUs and memory as the container's limits.

Every container carries the label ``dev.shipyard.home`` with a digest of the gateway's
home folder, and its name says which instance it is: a restarted gateway removes the
containers of its home (it starts its fleets again) and never looks at any other.

The engine is reached through the ``docker`` package, the Docker project's own client:
it speaks the Engine API over ``DOCKER_HOST`` (a unix socket, TCP, TLS or SSH) and reads
registry credentials from the usual Docker config file, which is what a user's own
``docker`` command does. Calls block, so they run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import resource
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from shipyard import launch
from shipyard.backends.base import InstanceHandle, InstanceSpec, Resources, log_tail
from shipyard.errors import BackendError
from shipyard.job_contract import JobSpec
from shipyard.routing.model_agent import MODELS_FOLDER
from shipyard.storage.artifacts import ArtifactStore

log = logging.getLogger(__name__)

LABEL_HOME = "dev.shipyard.home"
"""A digest of the home folder of the gateway that started the container."""
LABEL_INSTANCE = "dev.shipyard.instance"
LABEL_ENDPOINT = "dev.shipyard.endpoint"
LABEL_KIND = "dev.shipyard.kind"
"""``instance`` or ``job``: set on every container shipyard creates, over any label of the
same name its image carries, and what a gateway's sweep goes by."""
LABEL_JOB = "dev.shipyard.job"
"""A training job's container (its runner's, not a gateway's: it outlives gateways)."""
LABEL_WORKDIR = "dev.shipyard.workdir"
BIND_TO_PORT_LABEL = "com.amazonaws.sagemaker.capabilities.accept-bind-to-port"
"""An image labelled ``true`` listens on ``SAGEMAKER_BIND_TO_PORT`` instead of 8080."""
BIDI_LABEL = "com.amazonaws.sagemaker.capabilities.bidirectional-streaming"
"""An image labelled ``true`` serves bidirectional streams, as SageMaker reads it."""
SERVE_PORT = 8080
"""Where a hosting image listens, unless it accepts SAGEMAKER_BIND_TO_PORT."""
BIND_PORT = 8080
"""The port inside the container an image that accepts one is told to bind to; its
network namespace is its own, so any port will do, and this one is in the range below."""
SAFE_PORT_RANGE = "8080-8090"
STOP_GRACE_S = 30.0
"""SIGTERM, then SIGKILL this long after, as SageMaker stops a container."""
MODEL_DIR = "/opt/ml/model"
DROPPED_CAPABILITIES = ["MKNOD", "NET_RAW", "AUDIT_WRITE", "SYS_CHROOT"]
"""Of the engine's default capabilities, those no model server or training program
needs and an image could misuse: device nodes in the folders the gateway reads, raw
packets on the bridge."""
PIDS_LIMIT = 4096
"""Processes and threads a container may have, so none can fork the host to a halt."""
HARDENING: dict[str, Any] = {
    "security_opt": ["no-new-privileges"],
    "cap_drop": DROPPED_CAPABILITIES,
    "pids_limit": PIDS_LIMIT,
}
"""What every container shipyard creates runs with, an instance's or a job's (with
``host_ulimits`` and the writable layer's cap: Engine.create)."""
DISK_BYTES_ENV = "SHIPYARD_CONTAINER_DISK_BYTES"
"""The most a container may write to its own layer (bytes; 0: no cap)."""
DEFAULT_DISK_BYTES = 10 << 30
RLIMITS = {
    "nofile": (resource.RLIMIT_NOFILE, "/proc/sys/fs/nr_open"),
    "nproc": (resource.RLIMIT_NPROC, "/proc/sys/kernel/pid_max"),
}
"""The limits a container is given explicitly: each with the kernel's own ceiling (no
more files can be open in a process, no more processes exist)."""
_RLIMIT_NAMES = {int(which): name for name, (which, _) in RLIMITS.items()}
_RLIMIT_REFUSED = re.compile(r"rlimit type (\d+)")
_NO_DISK_CAP = re.compile(r"storage.?opt|overlay\.size|quota|backingfs", re.IGNORECASE)
CONTAINER_MODELS_DIR = "/opt/ml/models"
"""Where a multi-model container sees the models the gateway fetched for it (read-only;
the gateway's ModelAgent names a folder under it in each ``POST /models``)."""
PULL_POLICIES = ("missing", "always", "never")
ENGINE_THREADS = 32
"""Engine calls (starts, stops) under way at once."""
_STATS_REUSE_S = 1.0
"""How long one reading of a container's stats answers for."""
_POLL_S = 0.5
"""How often the states of this home's containers are read (one call for all)."""
_USED_MARK = "containers"
"""A file in the run folder, made at the first container's start: a gateway whose home
never ran one does not contact an engine when it starts."""


def home_label(home: Path) -> str:
    """The ``dev.shipyard.home`` label of the containers a gateway on ``home`` starts."""
    return hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]


def container_name(home: str, instance_id: str) -> str:
    """An engine-legal name saying whose container it is."""
    return "shipyard-" + home[:8] + "-" + re.sub(r"[^a-zA-Z0-9_.-]", "-", instance_id)[:200]


@dataclass(slots=True)
class ContainerInstance:
    """A started container, as the container backend knows it."""

    instance_id: str
    url: str
    container_id: str
    name: str
    log_path: Path | None
    reason: str | None = None
    follower: threading.Thread | None = field(default=None, repr=False)
    stats: tuple[float, dict[str, Any]] | None = field(default=None, repr=False)
    """The engine's last stats of it and when (monotonic): memory and CPU are asked for
    one after the other, and one engine call answers both."""
    socket_path: str | None = None
    """Containers are reached on their published port only."""
    streams_both_ways: bool = False
    """Whether its image is labelled BIDI_LABEL=true: it serves bidirectional streams on
    a WebSocket (gateway/doors/bidi.py); without the label a stream is refused."""

    def __repr__(self) -> str:
        return f"ContainerInstance(id={self.instance_id!r}, name={self.name!r}, url={self.url!r})"


class Engine:
    """One connection to the engine, opened when first needed and kept."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = {
            k: v
            for k, v in environ.items()
            if k.startswith("DOCKER_") or k in ("HOME", "SHIPYARD_IMAGE_PULL", DISK_BYTES_ENV)
        }
        self._client: Any = None
        self._lock = threading.Lock()
        text = environ.get(DISK_BYTES_ENV, "").strip()
        if text and not (text.isdigit()):
            raise ValueError(f"{DISK_BYTES_ENV}: {text!r} is not a number of bytes")
        self.disk_bytes = int(text) if text else DEFAULT_DISK_BYTES
        """The cap on each container's writable layer; 0 once the engine cannot cap it."""

    def variables(self) -> dict[str, str]:
        """What a process that talks to the engine itself (a job runner) is given: the
        ``DOCKER_*`` variables, and the Docker config (registry credentials) of this
        gateway's user, since the process has a home of its own."""
        variables = {k: v for k, v in self._environ.items() if k != "HOME"}
        if "DOCKER_CONFIG" not in variables and self._environ.get("HOME"):
            variables["DOCKER_CONFIG"] = str(Path(self._environ["HOME"]) / ".docker")
        return variables

    @property
    def where(self) -> str:
        return self._environ.get("DOCKER_HOST") or "the default Docker socket"

    def create(self, client: Any, image: str, **options: Any) -> Any:
        """A new container of ``image``, with what every container gets: HARDENING, the
        host's resource limits (``host_ulimits``: an engine that asks for more than its
        host allows fails every container) and its writable layer capped at
        ``disk_bytes``. Engines cap the layer only on some storage (Docker: overlay on
        XFS with project quotas; Podman: overlay on XFS); on any other, the first
        refusal is logged and containers run uncapped from then on."""
        from docker.errors import APIError
        from docker.types import Ulimit

        ulimits = [Ulimit(name=n, soft=v, hard=v) for n, v in host_ulimits().items()]
        options = {**HARDENING, "ulimits": ulimits, **options}
        if self.disk_bytes:
            try:
                size = {"size": str(self.disk_bytes)}
                return client.containers.create(image, storage_opt=size, **options)
            except APIError as exc:
                if not _NO_DISK_CAP.search(str(exc)):
                    raise
                log.warning(
                    "The container engine at %s cannot cap a container's writable layer "
                    "(%s): containers run without %s's cap.",
                    self.where,
                    _first_line(exc),
                    DISK_BYTES_ENV,
                )
                self.disk_bytes = 0
        return client.containers.create(image, **options)

    def client(self) -> Any:
        """The engine's client, connected.

        Raises:
            BackendError: no engine answers; the message says where it was looked for.
        """
        with self._lock:
            if self._client is not None:
                return self._client
            import docker  # the engine's client is loaded by gateways that use one

            try:
                # A connection per container's log stream, and the calls beside them.
                client = docker.DockerClient.from_env(
                    environment=self._environ, timeout=120, max_pool_size=256
                )
                client.ping()
            except Exception as exc:  # DockerException, or a connection's OSError
                raise BackendError(
                    f"No container engine answers at {self.where} ({_first_line(exc)}). "
                    "Start Docker, or Podman's Docker-compatible service "
                    "(podman system service), and set DOCKER_HOST."
                ) from None
            self._client = client
            return client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
                self._client = None


class ContainerBackend:
    """Starts, stops and watches the containers of instances whose Image is a
    container image. The local backend hands it those (backends/local.py)."""

    def __init__(
        self,
        *,
        home: Path,
        run_dir: Path,
        models_dir: Path,
        environ: Mapping[str, str],
        artifacts: ArtifactStore | None = None,
    ) -> None:
        self.engine = Engine(environ)
        self.home = home_label(home)
        self.run_dir = run_dir
        self.models_dir = models_dir
        self.artifacts = artifacts or ArtifactStore()
        """Fetches a container's model in the gateway's process: the gateway's own, with
        ``auth.file_roots`` enforced where the files are opened."""
        policy = environ.get("SHIPYARD_IMAGE_PULL", "missing").strip().lower() or "missing"
        if policy not in PULL_POLICIES:
            raise ValueError(
                f"SHIPYARD_IMAGE_PULL: {policy!r} is not one of {', '.join(PULL_POLICIES)}"
            )
        self.pull = policy
        self._live: dict[str, ContainerInstance] = {}
        """The containers this gateway runs, by container id."""
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._closed = threading.Event()
        self._calls = ThreadPoolExecutor(max_workers=ENGINE_THREADS, thread_name_prefix="engine")
        """Engine calls block (a pull for minutes, a stop for its 30 s grace): they get
        threads of their own, never the event loop's default pool, which the store uses."""

    def __repr__(self) -> str:
        return f"ContainerBackend(engine={self.engine.where!r}, home={self.home!r})"

    def check(self) -> None:
        """Connect now (``--backend docker``: a gateway without an engine refuses to
        start). Raises BackendError as Engine.client."""
        self.engine.client()

    # -- instances ------------------------------------------------------------------------

    async def start(self, spec: InstanceSpec) -> InstanceHandle:
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(self._calls, self._model_folder, spec)
        started = loop.run_in_executor(self._calls, self._start, spec, model)
        try:
            # Shielded: a thread cannot be cancelled, so a start cancelled (the endpoint
            # deleted, the gateway stopping) goes on, and what it started is stopped.
            handle = await asyncio.shield(started)
        except asyncio.CancelledError:
            started.add_done_callback(self._stop_unwanted)
            raise
        self._watch()
        return handle

    def _stop_unwanted(self, started: asyncio.Future[ContainerInstance]) -> None:
        if started.cancelled() or started.exception() is not None:
            return
        try:
            self._calls.submit(self._stop, started.result())
        except RuntimeError:  # the backend is closing: a thread of its own, then
            threading.Thread(target=self._stop, args=(started.result(),), daemon=True).start()

    def _model_folder(self, spec: InstanceSpec) -> Path:
        if spec.workdir is not None:
            # A multi-model instance: the folder the gateway fetches its models into.
            models = spec.workdir / MODELS_FOLDER
            models.mkdir(parents=True, exist_ok=True)
            return models
        try:
            return launch.model_folder(spec.model_url, self.models_dir, store=self.artifacts)
        except Exception as exc:
            raise BackendError(
                f"Instance {spec.instance_id} failed to start: the model artifact "
                f"{spec.model_url} could not be fetched: {_first_line(exc)}"
            ) from exc

    def _start(self, spec: InstanceSpec, model: Path) -> ContainerInstance:
        client = self.engine.client()
        image = _pulled(client, spec.image, self.pull)
        labels = (image.attrs.get("Config") or {}).get("Labels") or {}
        environment = dict(spec.environment)
        port = SERVE_PORT
        if str(labels.get(BIND_TO_PORT_LABEL, "")).lower() == "true":
            port = BIND_PORT
            environment["SAGEMAKER_BIND_TO_PORT"] = str(port)
            environment["SAGEMAKER_SAFE_PORT_RANGE"] = SAFE_PORT_RANGE
        else:
            # The built-in runtime's port is no business of an image's.
            environment.pop("SAGEMAKER_BIND_TO_PORT", None)
        name = container_name(self.home, spec.instance_id)
        self._remove_named(client, name)  # a restart of the slot, or a leftover
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / _USED_MARK).touch()
        try:
            container = self.engine.create(
                client,
                image.id,
                command=["serve"],
                name=name,
                hostname=spec.hostname or None,
                environment=environment,
                labels={
                    LABEL_HOME: self.home,
                    LABEL_KIND: "instance",
                    LABEL_INSTANCE: spec.instance_id,
                    LABEL_ENDPOINT: spec.endpoint or "",
                },
                ports={f"{port}/tcp": ("127.0.0.1", None)},
                volumes={
                    str(model): {
                        "bind": MODEL_DIR if spec.workdir is None else CONTAINER_MODELS_DIR,
                        "mode": "ro",
                    }
                },
                **_limits(client, spec.resources),
            )
            container.start()
            container.reload()
        except Exception as exc:
            self._remove_named(client, name)
            raise BackendError(
                f"Instance {spec.instance_id} failed to start: the engine could not run "
                f"{spec.image}: {_engine_refusal(exc)}"
            ) from None
        published = (container.attrs["NetworkSettings"].get("Ports") or {}).get(f"{port}/tcp")
        if not published:
            reason = _exited(container.attrs) or "its port was not published"
            self._remove_named(client, name)
            raise BackendError(f"Instance {spec.instance_id} failed to start: {reason}")
        handle = ContainerInstance(
            instance_id=spec.instance_id,
            url=f"http://127.0.0.1:{published[0]['HostPort']}",
            container_id=container.id,
            name=name,
            log_path=spec.log_path,
            streams_both_ways=str(labels.get(BIDI_LABEL, "")).lower() == "true",
        )
        if spec.log_path is not None:
            handle.follower = threading.Thread(
                target=self._follow, args=(handle,), name=f"logs-{name}", daemon=True
            )
            handle.follower.start()
        with self._lock:
            self._live[container.id] = handle
        log.info("started container %s (%s) for instance %s", name, spec.image, spec.instance_id)
        return handle

    def _remove_named(self, client: Any, name: str) -> None:
        with contextlib.suppress(Exception):
            client.api.remove_container(name, force=True, v=True)

    def _follow(self, handle: ContainerInstance) -> None:
        """Append the container's output to its instance's log until it ends."""
        assert handle.log_path is not None
        try:
            client = self.engine.client()
            with open(handle.log_path, "ab", buffering=0) as out:
                for chunk in client.api.logs(
                    handle.container_id, stream=True, follow=True, stdout=True, stderr=True
                ):
                    out.write(chunk)
        except Exception as exc:  # the container was removed, the engine went away
            log.debug("log of %s ends: %s", handle.name, exc)

    async def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        assert isinstance(handle, ContainerInstance)
        await asyncio.get_running_loop().run_in_executor(self._calls, self._stop, handle)

    def _stop(self, handle: ContainerInstance) -> None:
        with self._lock:
            self._live.pop(handle.container_id, None)
        try:
            client = self.engine.client()
        except BackendError:
            return
        with contextlib.suppress(Exception):
            client.api.stop(handle.container_id, timeout=int(STOP_GRACE_S))
        if handle.follower is not None:  # its last lines, before removal ends the stream
            handle.follower.join(timeout=5)
        with contextlib.suppress(Exception):
            client.api.remove_container(handle.container_id, force=True, v=True)

    def exit_reason(self, handle: InstanceHandle) -> str | None:
        assert isinstance(handle, ContainerInstance)
        return handle.reason

    def memory_bytes(self, handle: InstanceHandle) -> int | None:
        """What ``docker stats`` shows: the cgroup's usage less its inactive page cache
        (files read once, which the kernel takes back first)."""
        memory = self._stats(handle).get("memory_stats") or {}
        usage = memory.get("usage")
        if usage is None:
            return None
        cache = memory.get("stats") or {}
        inactive = cache.get("inactive_file", cache.get("total_inactive_file", 0))
        return max(int(usage) - int(inactive or 0), 0)

    def cpu_seconds(self, handle: InstanceHandle) -> float | None:
        stats = self._stats(handle)
        total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
        return total / 1e9 if total is not None else None

    def _stats(self, handle: InstanceHandle) -> dict[str, Any]:
        from docker.errors import InvalidVersion

        assert isinstance(handle, ContainerInstance)
        if handle.reason is not None:
            return {}
        if handle.stats is not None and time.monotonic() - handle.stats[0] < _STATS_REUSE_S:
            return handle.stats[1]
        try:
            api = self.engine.client().api
            try:
                # one_shot: at once, without the second sample Docker otherwise waits
                # for; engines before API 1.41 do not know it.
                stats = api.stats(handle.container_id, stream=False, one_shot=True)
            except InvalidVersion:
                stats = api.stats(handle.container_id, stream=False)
        except Exception:
            return {}
        stats = stats if isinstance(stats, dict) else {}
        handle.stats = (time.monotonic(), stats)
        return stats

    # -- watching -------------------------------------------------------------------------

    def _watch(self) -> None:
        """Start the thread that reads this home's containers' states, once."""
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._poll, name="container-states", daemon=True
                )
                self._watcher.start()

    def _poll(self) -> None:
        failing = False
        while not self._closed.wait(_POLL_S):
            with self._lock:
                live = dict(self._live)
            if not live:
                continue
            try:
                client = self.engine.client()
                listed = client.api.containers(
                    all=True, filters={"label": f"{LABEL_HOME}={self.home}"}
                )
            except Exception as exc:
                if not failing:  # once per outage, not every poll
                    log.warning("could not read the containers' states: %s", _first_line(exc))
                failing = True
                continue
            failing = False
            states = {c["Id"]: str(c.get("State", "")).lower() for c in listed}
            for container_id, handle in live.items():
                state = states.get(container_id)
                if state == "running" or handle.reason is not None:
                    continue
                handle.reason = self._reason(client, handle, state)

    def _reason(self, client: Any, handle: ContainerInstance, state: str | None) -> str:
        """Why the container is not running, for the instance's FailureReason."""
        if state is None:
            return f"its container {handle.name} was removed from the engine"
        try:
            attrs = client.api.inspect_container(handle.container_id)
        except Exception:
            return f"its container {handle.name} is {state}"
        reason = _exited(attrs) or f"its container {handle.name} is {state}"
        if handle.follower is not None:  # its last lines, which end with the container
            handle.follower.join(timeout=1)
        return reason + log_tail(handle.log_path)

    # -- the gateway's start and stop ------------------------------------------------------

    def stop_leftovers(self) -> list[str]:
        """Remove the containers an earlier gateway on this home left (its fleets are
        started again); no other container is looked at. A home that never ran a
        container contacts no engine."""
        if not (self.run_dir / _USED_MARK).exists():
            return []
        try:
            client = self.engine.client()
            listed = client.api.containers(all=True, filters={"label": f"{LABEL_HOME}={self.home}"})
        except Exception as exc:
            log.warning("could not look for containers left by an earlier gateway: %s", exc)
            return []
        removed = []
        for container in listed:
            labels = container.get("Labels") or {}
            kind = labels.get(LABEL_KIND, "job" if LABEL_JOB in labels else "instance")
            if labels.get(LABEL_HOME) != self.home or kind != "instance":
                continue  # a job's (its runner's), or an engine that ignored the filter
            with contextlib.suppress(Exception):
                client.api.remove_container(container["Id"], force=True, v=True)
                removed.append(container["Id"])
                log.warning(
                    "removed container %s, left by an earlier gateway",
                    (container.get("Names") or [container["Id"]])[0],
                )
        return removed

    def close(self) -> None:
        self._closed.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
        # Not waited for here (a pull may take minutes); what is still recorded as
        # running (a start that finished after its fleet let go) is stopped.
        self._calls.shutdown(wait=False, cancel_futures=False)
        with self._lock:
            left = list(self._live.values())
        for handle in left:
            self._stop(handle)
        self.engine.close()


def job_container_name(workdir: Path) -> str:
    """The container of the job attempt run in ``workdir``: its runner and the gateway
    (``kill_job``) find it by this name alone."""
    return "shipyard-job-" + hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class TrainingEnd:
    exit_code: int
    lost: bool
    """Killed from outside (SIGKILL that nobody here sent, not for memory): the
    instance was lost, as when a runner dies, rather than the algorithm failing."""
    reason: str | None = None


class TrainingContainer:
    """One attempt of a training job in its image, under SageMaker's training contract:
    ``<image> train`` (or ContainerEntrypoint / ContainerArguments) with the attempt's
    ``/opt/ml`` tree (jobs/layout.py) bound at ``/opt/ml``, its Environment and
    ``TRAINING_JOB_NAME`` / ``TRAINING_JOB_ARN``, limited to its InstanceType. Run by
    the job runner (jobs/runner.py), which outlives the gateway; a gateway that gives
    the job up removes it by name (``remove_job_container``)."""

    def __init__(self, engine: Engine, workdir: Path) -> None:
        self.engine = engine
        self.name = job_container_name(workdir)
        self.workdir = workdir
        self.stopping = False
        """Whether ``stop`` was called: its end is then no loss."""

    def __repr__(self) -> str:
        return f"TrainingContainer(name={self.name!r})"

    def start(
        self,
        spec: JobSpec,
        opt_ml: Path,
        *,
        checkpoints: Path | None = None,
        pull: str = "missing",
    ) -> None:
        """Create and start it, replacing a container of the same name (an earlier run
        of this very attempt). ``checkpoints``: the folder synced for a CheckpointConfig
        whose LocalPath lies outside /opt/ml, shown there too. Raises BackendError
        saying why it cannot run."""
        from shipyard.instance_types import INSTANCE_TYPES

        client = self.engine.client()
        with contextlib.suppress(Exception):
            client.api.remove_container(self.name, force=True, v=True)
        image = _pulled(client, spec.image, pull)
        known = INSTANCE_TYPES.get(spec.resource.instance_type)
        resources = Resources(known.vcpus, known.memory_bytes) if known is not None else None
        limits = _limits(client, resources)
        volumes = {str(opt_ml): {"bind": "/opt/ml", "mode": "rw"}}
        local_path = spec.checkpoint.local_path if spec.checkpoint else None
        if checkpoints is not None and local_path and _bindable(local_path):
            volumes[str(checkpoints)] = {"bind": local_path, "mode": "rw"}
        environment = {
            **spec.environment,
            "TRAINING_JOB_NAME": spec.name,
            "TRAINING_JOB_ARN": spec.arn,
        }
        try:
            container = self.engine.create(
                client,
                image.id,
                entrypoint=list(spec.entrypoint) if spec.entrypoint else None,
                command=list(spec.arguments)
                if spec.arguments
                else []
                if spec.entrypoint
                else ["train"],
                name=self.name,
                hostname="algo-1",
                # EnableNetworkIsolation: no interface but loopback (its data is mounted).
                network_mode="none" if spec.network_isolation else None,
                environment=environment,
                labels={
                    LABEL_KIND: "job",
                    LABEL_JOB: spec.name,
                    LABEL_WORKDIR: str(self.workdir),
                },
                volumes=volumes,
                **limits,
            )
            container.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                client.api.remove_container(self.name, force=True, v=True)
            raise BackendError(
                f"The engine could not run the training image {spec.image}: {_engine_refusal(exc)}"
            ) from None

    def output(self) -> Iterator[str]:
        """Its output, line by line, until it ends."""
        client = self.engine.client()
        pending = b""
        for chunk in client.api.logs(self.name, stream=True, follow=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode(errors="replace").rstrip("\r")
        if pending:
            yield pending.decode(errors="replace")

    def end(self) -> TrainingEnd | None:
        """How it ended; None while it runs. A container removed from the engine (by
        someone else) ended as a lost instance.

        Raises:
            BackendError: the engine does not answer (it may again: the caller decides
                how long to wait).
        """
        from docker.errors import NotFound

        try:
            attrs = self.engine.client().api.inspect_container(self.name)
        except NotFound:
            return TrainingEnd(-1, not self.stopping, "its container was removed from the engine")
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"the engine does not answer: {_first_line(exc)}") from None
        state = attrs.get("State") or {}
        if state.get("Running") or str(state.get("Status", "")).lower() in ("created", "running"):
            return None
        code = int(state.get("ExitCode") or 0)
        if state.get("OOMKilled"):
            return TrainingEnd(code, False, "the training container ran out of memory")
        return TrainingEnd(code, code == 137 and not self.stopping)

    def stop(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``, as StopTrainingJob does."""
        self.stopping = True
        with contextlib.suppress(Exception):
            self.engine.client().api.stop(self.name, timeout=max(int(grace_s), 1))

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.client().api.remove_container(self.name, force=True, v=True)


def _limits(client: Any, resources: Resources | None) -> dict[str, Any]:
    """An InstanceType's vCPUs and memory as a container's limits, at most what the
    engine's host has (an engine refuses a CPU limit above its CPU count)."""
    if resources is None:
        return {}
    info = client.info()
    cpus = min(resources.vcpus, float(info.get("NCPU") or resources.vcpus))
    memory = resources.memory_bytes
    if info.get("MemTotal"):
        memory = min(memory, int(info["MemTotal"]))
    return {"nano_cpus": int(cpus * 1e9), "mem_limit": memory}


def _bindable(path: str) -> bool:
    """Whether ``path`` may be a bind mount's target in a container: absolute, not the
    root, no ``..``, nothing but printable characters."""
    parts = PurePosixPath(path).parts
    return (
        path.startswith("/")
        and len(parts) > 1
        and ".." not in parts
        and path.isprintable()
        and ":" not in path
    )


def _pulled(client: Any, image: str, policy: str) -> Any:
    """The image, pulled when missing (or always, or never, by ``policy``)."""
    from docker.errors import ImageNotFound

    if policy != "always":
        try:
            return client.images.get(image)
        except ImageNotFound:
            if policy == "never":
                raise BackendError(
                    f"Image {image} is not on the container engine, and "
                    "SHIPYARD_IMAGE_PULL=never forbids pulling it."
                ) from None
        except Exception as exc:
            raise BackendError(
                f"The container engine could not look up {image}: {_first_line(exc)}"
            ) from None
    try:
        return client.images.pull(image)
    except Exception as exc:
        raise BackendError(
            f"Image {image} is not on the container engine and could not be pulled: "
            f"{_first_line(exc)}"
        ) from None


def remove_job_container(engine: Engine, workdir: Path) -> None:
    """Remove the container of the job attempt in ``workdir``, if there is one."""
    with contextlib.suppress(Exception):
        engine.client().api.remove_container(job_container_name(workdir), force=True, v=True)


def _exited(attrs: Mapping[str, Any]) -> str | None:
    """What a container's inspection says of its end; None while it runs."""
    state = attrs.get("State") or {}
    if state.get("Running"):
        return None
    if state.get("OOMKilled"):
        return "its container ran out of memory (the InstanceType's memory is its limit)"
    code = state.get("ExitCode")
    error = str(state.get("Error") or "").strip()
    return f"its container exited with code {code}" + (f": {error}" if error else "")


def ulimits_within(hard: dict[str, int], ceilings: dict[str, int | None]) -> dict[str, int]:
    """The value (soft and hard) a container asks for each of ``hard``'s limits: the
    hard limit, at most its kernel ceiling; a limit without any bound (unlimited, and no
    ceiling read) is left to the engine."""
    chosen = {}
    for name, value in hard.items():
        bounds = [v for v in (value, ceilings.get(name)) if v is not None and v >= 0]
        if value == resource.RLIM_INFINITY:
            bounds = [v for v in bounds if v != value]
        if bounds:
            chosen[name] = min(bounds)
    return chosen


def host_ulimits() -> dict[str, int]:
    """What each container asks for (RLIMITS): no more than this process's hard limits
    (the host's, when the engine runs beside the gateway) and the kernel's ceilings.
    Engines otherwise ask for their own defaults (Podman: a million files), which a
    host with lower hard limits (a container, a locked-down machine) refuses with
    "error setting rlimit"."""
    hard = {name: resource.getrlimit(which)[1] for name, (which, _) in RLIMITS.items()}
    return ulimits_within(hard, {name: _read_int(path) for name, (_, path) in RLIMITS.items()})


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _engine_refusal(exc: BaseException) -> str:
    """Why the engine could not run a container, with what to change when it could not
    set one of the resource limits."""
    first = _first_line(exc)
    refused = _RLIMIT_REFUSED.search(str(exc))
    if refused is None:
        return first
    name = _RLIMIT_NAMES.get(int(refused.group(1)), f"type {refused.group(1)}")
    key = {"nofile": "LimitNOFILE", "nproc": "LimitNPROC"}.get(name, "Limit*")
    return (
        f"{first}. The engine could not give the container the {name} limit asked for "
        f"(the gateway's own hard limit, {host_ulimits().get(name, 'unlimited')}): the "
        f"engine runs with a lower one. Raise the engine's ({key}= in its service, "
        "ulimit -H where it is started), or start the gateway with the engine's limit "
        "(ulimit -H)"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
