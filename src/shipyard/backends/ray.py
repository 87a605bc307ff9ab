"""Ray: instances and job runners placed on the nodes of a Ray cluster.

Each instance is one Ray actor that reserves the vCPUs and memory of its variant's
InstanceType (``InstanceSpec.resources``), so Ray places it on a node with that much
free. On its node the actor starts the command line the local backend would run (the
built-in runtime, or ``python -m shipyard.launch`` for a ``cmd:`` server) as an OS
process bound to the node's address on a free port, and reports address, port and PID.
The gateway then sends requests to that address itself: Ray places, watches and stops
instances, and never carries a request.

What runs on a node knows only what the spec says: the model artifact travels as its
URI and is fetched on the node (shipyard/launch.py), so use ``s3://`` artifacts; a
``file://`` URI or a path is read on the node, which works only where nodes share the
gateway's disk. A multi-model instance keeps its disk cache in a folder of the node's.

Instances outlive the gateway that started them: an instance of an endpoint's fleet
runs under a detached actor named ``instance/<endpoint>/<instance id>/<start>``, which
the fleet's routes in the store record (``RayInstance.ref``). The gateway that takes
the endpoint's lease over adopts the recorded instances that still answer (``adopt``)
and kills every other actor filed under the endpoint (``sweep``), so none is left
behind; one that stops cleanly stops its fleets, and with them their actors.

Liveness without blocking: each handle holds the reference of the actor's ``wait()``,
which resolves when the process ends and fails when the actor dies (its node lost), so
``exit_reason`` only looks at whether it has resolved. The reconciler's health checks
and restarts do the rest: a lost node's instances are started again where they fit.

A variant that fits no node waits in ``start`` (the endpoint stays Creating, and the
log says what it waits for) until the start timeout, then fails saying what it asked
for and what the nodes have.

An instance's log is written on its node and copied into the gateway's logs folder as it
grows (a ``read_log`` asked at each ``exit_reason``, appended when answered).

Job runners run the same way under a detached, named actor, since a job outlives the
gateway that started it; the gateway keeps a copy of the runner's status lines and log
in the job's folder (job_contract.py), fetched from the actor, so a job whose node is
lost still has what it reported, and is retried per its RetryStrategy.

Every call into Ray is in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.exceptions
import ray.util

from shipyard.backends.base import (
    JOB_RUNNER,
    InstanceHandle,
    InstanceSpec,
    JobHandle,
    Resources,
    runtime_for,
)
from shipyard.backends.ray_actors import Command, InstanceActor, JobActor
from shipyard.errors import BackendError
from shipyard.instance_types import GIB, INSTANCE_TYPES
from shipyard.job_contract import JOB_FILE, LOG_FILE, STATUS_FILE, JobSpec, StatusLine, read_status

log = logging.getLogger(__name__)

NAMESPACE = "shipyard"
"""The Ray namespace of shipyard's actors: job runners are found in it by name."""
_PLACEMENT_NOTE_AFTER_S = 5.0
"""How long an instance may wait for a node before the log says what it waits for."""
_CALL_TIMEOUT_S = 5.0
"""How long a blocking question to an actor may take before it counts as unanswered."""


_RemoteInstance: Any = ray.remote(max_restarts=0)(InstanceActor)
_RemoteJob: Any = ray.remote(max_restarts=0)(JobActor)


@dataclass(slots=True)
class RayInstance:
    instance_id: str
    url: str
    pid: int
    actor: Any
    ended: Any
    """The reference of the actor's ``wait()``."""
    ref: str | None = None
    """The actor's name, for an instance of an endpoint's fleet (detached, see the
    module); None: its actor dies with this gateway."""
    log_path: Path | None = None
    """The gateway's copy of the instance's log, which the log door reads."""
    log_read: Any = None
    """The reference of the actor's ``read_log()`` asked last, not yet copied."""
    log_copied: int = 0
    """Bytes of this process's log copied so far."""
    reason: str | None = None
    socket_path: str | None = None
    """A Ray instance may run on another node: reached on its port only."""

    def __repr__(self) -> str:
        return f"RayInstance(id={self.instance_id!r}, pid={self.pid}, url={self.url!r})"


def _reservation(resources: Resources | None) -> dict[str, Any]:
    if resources is None:
        return {"num_cpus": 0}
    return {"num_cpus": resources.vcpus, "memory": resources.memory_bytes or None}


def _describe(resources: Resources | None) -> str:
    if resources is None:
        return "no reserved resources"
    return f"{resources.vcpus:g} vCPU and {resources.memory_bytes / GIB:.3g} GiB of memory"


def _cause(exc: BaseException) -> str:
    """The first line of a Ray error, the remote exception's own when there is one."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        exc = exc.cause or exc
    text = str(exc).strip().splitlines()
    return text[-1] if isinstance(exc, ray.exceptions.RayError) and text else " ".join(text[:1])


class RayBackend:
    """Places instances and job runners on a Ray cluster's nodes (see the module)."""

    def __init__(
        self,
        *,
        address: str,
        s3: Mapping[str, str],
        start_timeout_s: float = 600.0,
    ) -> None:
        self.address = address
        self._s3 = dict(s3)
        """The S3 access sent to processes that use s3:// (their plain environment is
        their node's own: PATH and PYTHONPATH there, not the gateway's)."""
        self.start_timeout_s = start_timeout_s
        self._jobs: dict[str, Any] = {}
        """Job actors by handle ref, found once."""
        self._probes: dict[str, tuple[bool, Any]] = {}
        """By handle ref: whether the runner ran at the last answer, and the question
        asked since (``job_running``)."""
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ValueError(
                f"ray_address: could not join the Ray cluster at {address}: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"RayBackend(address={self.address!r})"

    # -- instances ------------------------------------------------------------------------

    async def start(self, spec: InstanceSpec) -> InstanceHandle:
        kind = runtime_for(spec.image)
        if kind == "docker":
            raise BackendError(
                f"Image {spec.image} is a container image, which needs a Docker engine; "
                "this gateway runs the ray backend. Use shipyard/python or cmd:<command>."
            )
        environment = {**(self._s3 if spec.s3_access else {}), **spec.environment}
        environment["SHIPYARD_INSTANCE_ID"] = spec.instance_id
        command = Command(
            instance_id=spec.instance_id,
            kind=kind,
            shell=spec.image.removeprefix("cmd:") if kind == "cmd" else None,
            model_url=spec.model_url,
            own_folder=spec.workdir is not None,
            environment=environment,
            cpu_nice=spec.cpu_nice,
            adapters_token=spec.adapters_token,
        )
        ref = None
        named: dict[str, Any] = {}
        if spec.endpoint is not None:
            ref = f"{_instance_prefix(spec.endpoint)}{spec.instance_id}/{uuid.uuid4().hex[:8]}"
            named = {"name": ref, "lifetime": "detached"}
        actor = _RemoteInstance.options(
            scheduling_strategy="SPREAD", **named, **_reservation(spec.resources)
        ).remote()
        try:
            host, port, pid = await self._placed(actor.start.remote(command), spec)
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        log.info("started instance %s pid %s on %s:%s", spec.instance_id, pid, host, port)
        return RayInstance(
            instance_id=spec.instance_id,
            url=_url(host, port),
            pid=pid,
            actor=actor,
            ended=actor.wait.remote(),
            ref=ref,
            log_path=spec.log_path,
        )

    async def adopt(
        self, ref: str, *, url: str, instance_id: str, log_path: Path | None
    ) -> RayInstance | None:
        """The instance whose actor is named ``ref``, started by another gateway, if it
        still runs at ``url``; None otherwise (its actor is then killed)."""
        try:
            actor = ray.get_actor(ref, namespace=NAMESPACE)
        except ValueError:
            return None
        answer: tuple[str, int, int] | None
        try:
            answer = await asyncio.wait_for(
                asyncio.wrap_future(actor.where.remote().future()), _CALL_TIMEOUT_S
            )
        except (TimeoutError, ray.exceptions.RayError):
            answer = None
        if answer is None or _url(answer[0], answer[1]) != url:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(actor, no_restart=True)
            return None
        log.info("adopted instance %s pid %s at %s as %s", ref, answer[2], url, instance_id)
        return RayInstance(
            instance_id=instance_id,
            url=url,
            pid=int(answer[2]),
            actor=actor,
            ended=actor.wait.remote(),
            ref=ref,
            log_path=log_path,
        )

    def sweep(self, endpoint: str, *, keep: Collection[str] = ()) -> list[str]:
        """Kill every instance actor filed under ``endpoint`` but those named in ``keep``
        (the fleet run here); the names of those killed."""
        prefix = _instance_prefix(endpoint)
        try:
            names = ray.util.list_named_actors()
        except Exception as exc:  # the next sweep tries again
            log.warning("could not list the instances of %s on the Ray cluster: %s", endpoint, exc)
            return []
        killed = []
        for name in names:
            if not isinstance(name, str) or not name.startswith(prefix) or name in keep:
                continue
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
                killed.append(name)
        if killed:
            log.info("stopped instances of %s no gateway runs: %s", endpoint, ", ".join(killed))
        return killed

    async def _placed(self, started: Any, spec: InstanceSpec) -> Any:
        """What ``started`` returns, once Ray has placed the actor and it has started the
        process; BackendError, saying why, if it cannot within the start timeout."""
        future = asyncio.wrap_future(started.future())
        note_after = min(_PLACEMENT_NOTE_AFTER_S, self.start_timeout_s / 2)
        waited = 0.0
        try:
            while waited < self.start_timeout_s:
                step = min(note_after, self.start_timeout_s - waited)
                done, _ = await asyncio.wait({future}, timeout=step)
                if done:
                    return future.result()
                waited += step
                if waited == note_after:
                    log.warning(
                        "instance %s waits for a Ray node with %s free (%s)",
                        spec.instance_id,
                        _describe(spec.resources),
                        self._capacity(),
                    )
        except ray.exceptions.RayError as exc:
            raise BackendError(
                f"Could not start instance {spec.instance_id} on the Ray cluster: {_cause(exc)}"
            ) from exc
        finally:
            # Given up on (timed out, or the gateway stopping): its actor is killed, and
            # the error that then ends ``started`` is nobody's business.
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise BackendError(
            f"Instance {spec.instance_id} could not be placed on the Ray cluster within "
            f"{self.start_timeout_s:g} s: it needs {_describe(spec.resources)} "
            f"({self._capacity()})."
        )

    def _capacity(self) -> str:
        """What the cluster's live nodes have, for a message that says why nothing fits."""
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        except Exception as exc:  # a message, not worth failing for
            return f"the cluster's nodes are unknown: {exc}"
        if not nodes:
            return "the cluster has no live node"
        sizes = [
            f"{n['NodeManagerAddress']}: {n['Resources'].get('CPU', 0):g} vCPU, "
            f"{n['Resources'].get('memory', 0) / GIB:.3g} GiB"
            for n in nodes
        ]
        return "nodes: " + "; ".join(sizes)

    async def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        assert isinstance(handle, RayInstance)
        try:
            stopped = handle.actor.stop.remote(timeout_s)
            await asyncio.wait_for(asyncio.wrap_future(stopped.future()), timeout_s + 5.0)
        except (TimeoutError, ray.exceptions.RayError) as exc:
            log.info("instance %s: stopping on its node failed: %s", handle.instance_id, exc)
        # Then the actor: its node's worker goes, and what it still ran with it.
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(handle.actor, no_restart=True)

    def exit_reason(self, handle: InstanceHandle) -> str | None:
        """Also copies what the instance logged since the last call into the gateway's
        copy of its log (the reconciler asks every health-check period)."""
        assert isinstance(handle, RayInstance)
        _copy_log(handle)
        if handle.reason is not None:
            return handle.reason
        done, _ = ray.wait([handle.ended], timeout=0, fetch_local=False)
        if not done:
            return None
        try:
            handle.reason = str(ray.get(handle.ended, timeout=_CALL_TIMEOUT_S))
        except ray.exceptions.ActorDiedError as exc:
            handle.reason = f"its Ray actor was lost ({_death(exc)})"
        except ray.exceptions.ActorUnavailableError as exc:
            # How a detached actor's node loss first shows (it is never restarted).
            handle.reason = f"its Ray actor was lost (unreachable: {_cause(exc)})"
        except ray.exceptions.RayError as exc:
            handle.reason = f"its Ray actor failed: {_cause(exc)}"
        return handle.reason

    def cpu_seconds(self, handle: InstanceHandle) -> float | None:
        """Unknown on Ray: the instance runs on another node (its actor reports memory,
        not CPU time); CPUUtilization is not published for it."""
        return None

    def memory_bytes(self, handle: InstanceHandle) -> int | None:
        assert isinstance(handle, RayInstance)
        try:
            used = ray.get(handle.actor.memory_bytes.remote(), timeout=_CALL_TIMEOUT_S)
        except ray.exceptions.RayError:
            return None
        return None if used is None else int(used)

    def stop_leftovers(self) -> list[int]:
        """Nothing to do: an endpoint's instances are the business of whoever holds its
        lease (adopted or swept), and any other instance's actor belongs to the gateway's
        Ray driver, which Ray stops when the driver goes, and with it its process."""
        return []

    def close(self) -> None:
        ray.shutdown()

    # -- job runners ----------------------------------------------------------------------

    async def start_job(
        self,
        workdir: Path,
        *,
        s3_endpoint_url: str | None,
        s3_access: bool = True,
        runner: str = JOB_RUNNER,
    ) -> JobHandle:
        if runner != JOB_RUNNER:
            raise BackendError("The ray backend runs training jobs only; use the local backend.")
        job_json = (workdir / JOB_FILE).read_text()
        spec = JobSpec.from_json(job_json)
        known = INSTANCE_TYPES.get(spec.resource.instance_type)
        resources = Resources(known.vcpus, known.memory_bytes) if known else None
        name = _job_name(workdir)
        actor = _RemoteJob.options(
            name=name,
            lifetime="detached",
            scheduling_strategy="SPREAD",
            **_reservation(resources),
        ).remote()
        argv = ["--s3-endpoint-url", s3_endpoint_url] if s3_endpoint_url else []
        env = dict(self._s3) if s3_access else {}
        started = actor.start.remote(name, job_json, argv, env)
        try:
            host, pid = await asyncio.wait_for(
                asyncio.wrap_future(started.future()), self.start_timeout_s
            )
        except (TimeoutError, ray.exceptions.RayError) as exc:
            ray.kill(actor, no_restart=True)
            why = (
                f"no Ray node had {_describe(resources)} free within {self.start_timeout_s:g} s"
                if isinstance(exc, TimeoutError)
                else _cause(exc)
            )
            raise BackendError(f"Could not start the job runner on the Ray cluster: {why}") from exc
        log.info("started job runner %s pid %s on %s", name, pid, host)
        ref = _job_ref(name, workdir)
        self._jobs[ref] = actor
        return JobHandle(ref)

    def attach_job(self, ref: str) -> JobHandle:
        _job_parts(ref)  # refuse a ref that is not ours at once
        return JobHandle(ref)

    def find_job(self, workdir: Path) -> JobHandle | None:
        name = _job_name(workdir)
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return None
        ref = _job_ref(name, workdir)
        self._jobs[ref] = actor
        return JobHandle(ref)

    def _job_actor(self, ref: str) -> Any | None:
        actor = self._jobs.get(ref)
        if actor is None:
            name, _ = _job_parts(ref)
            try:
                actor = self._jobs[ref] = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                return None
        return actor

    def job_running(self, handle: JobHandle) -> bool:
        """The last answer of the runner's actor, and a new question asked: called on the
        gateway's event loop, so it never waits for a node (a lost one may take seconds
        to be known lost). Until an actor has answered once, it runs."""
        actor = self._job_actor(handle.ref)
        if actor is None:
            return False
        running, probe = self._probes.get(handle.ref, (True, None))
        if probe is not None:
            if not ray.wait([probe], timeout=0, fetch_local=False)[0]:
                return running
            try:
                running = bool(ray.get(probe, timeout=_CALL_TIMEOUT_S))
            except ray.exceptions.RayError:
                running = False  # the actor is gone, with its node or killed
        self._probes[handle.ref] = (running, actor.running.remote() if running else None)
        return running

    def job_status(self, handle: JobHandle, *, skip: int) -> list[StatusLine]:
        """The runner's status lines, from the gateway's copy of them, brought up to date
        from the actor while it answers; also its log, for the job's log door."""
        _, workdir = _job_parts(handle.ref)
        status, job_log = workdir / STATUS_FILE, workdir / LOG_FILE
        actor = self._job_actor(handle.ref)
        if actor is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                new_status, new_log = ray.get(
                    actor.read.remote(_size(status), _size(job_log)), timeout=_CALL_TIMEOUT_S
                )
                _append(job_log, new_log)
                _append(status, new_status)
        lines = read_status(status, skip=skip)
        if actor is not None and any(line.final for line in lines):
            # Its outcome is in the gateway's copy: the actor has nothing left to give.
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(actor, no_restart=True)
            self._forget_job(handle.ref)
        return lines

    def signal_job(self, handle: JobHandle, sig: int) -> None:
        actor = self._job_actor(handle.ref)
        if actor is not None:
            actor.signal.remote(int(sig))

    def kill_job(self, handle: JobHandle) -> None:
        actor = self._job_actor(handle.ref)
        if actor is None:
            return
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(actor.kill.remote(), timeout=_CALL_TIMEOUT_S)
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(actor, no_restart=True)
        self._forget_job(handle.ref)

    def _forget_job(self, ref: str) -> None:
        self._jobs.pop(ref, None)
        self._probes.pop(ref, None)


def _copy_log(handle: RayInstance) -> None:
    """Append the answer of the last ``read_log`` to the gateway's copy, if it has come,
    and ask for the next: never waits, as ``exit_reason`` runs on the event loop."""
    if handle.log_path is None:
        return
    if handle.log_read is not None:
        if not ray.wait([handle.log_read], timeout=0, fetch_local=False)[0]:
            return
        try:
            data = ray.get(handle.log_read, timeout=_CALL_TIMEOUT_S)
            _append(handle.log_path, data, durable=False)
        except (ray.exceptions.RayError, OSError):
            handle.log_path = None  # the actor is gone (or the copy cannot be written)
            return
        handle.log_copied += len(data)
    handle.log_read = handle.actor.read_log.remote(handle.log_copied)


def _instance_prefix(endpoint: str) -> str:
    # Endpoint names have no "/": no endpoint's prefix is another's.
    return f"instance/{endpoint}/"


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _death(exc: ray.exceptions.ActorDiedError) -> str:
    text = str(exc)
    if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
        return "the Ray node it ran on was lost"
    return _cause(exc)


def _job_name(workdir: Path) -> str:
    """A job runner's actor name: the job and its attempt (``job:<name>/attempt-<n>``),
    the same from any gateway that shares the store."""
    return f"job:{workdir.parent.name}/{workdir.name}"


def _job_ref(name: str, workdir: Path) -> str:
    return f"ray:{name}:{workdir}"


def _job_parts(ref: str) -> tuple[str, Path]:
    """The actor name and the gateway's job folder in a Ray handle's ``ref``."""
    kind, _, rest = ref.partition(":")
    prefix, _, rest = rest.partition(":")
    job, _, workdir = rest.partition(":")  # job names have no colon; folders may
    if kind != "ray" or prefix != "job" or not job or not workdir:
        raise ValueError(f"not a Ray job runner: {ref!r}")
    return f"job:{job}", Path(workdir)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _append(path: Path, data: bytes, *, durable: bool = True) -> None:
    """``durable``: synced to disk before returning, for what the gateway acts on."""
    if data:
        with open(path, "ab") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
