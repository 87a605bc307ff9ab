"""Multi-container instances: one instance of a multi-container model is a group of
processes, one per container, each on its own port.

The group is made here, above the backends, which go on starting single processes:
ContainerGroups wraps the gateway's Backend so that starting a GroupSpec starts each of
its containers as a plain instance (with a SAGEMAKER_BIND_TO_PORT of its own) and
returns one GroupHandle, and stopping, exit reasons and memory cover every container.
So the provisioner, supervision and the serverless memory checks treat a group as any
instance: health-checked with ``/ping`` (on each container, routing/pipeline.py),
restarted whole when a container dies or stops answering, counted as one instance by
DesiredInstanceCount and the autoscaler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shipyard.backends.base import Backend, InstanceHandle, InstanceSpec
from shipyard.records import ExecutionMode, Model
from shipyard.routing.instance import Instance
from shipyard.routing.pipeline import Container, ContainerGroupPool, container_name


@dataclass(frozen=True, slots=True)
class ContainerTemplate:
    """How one container of every instance of a variant starts."""

    name: str
    """ContainerHostname, else ``container <n>``: how errors and logs name it."""
    hostname: str | None
    image: str
    environment: dict[str, str]
    """The container's own Environment."""
    model_url: str | None


@dataclass(frozen=True, slots=True)
class GroupTemplate:
    """The containers of a multi-container model, in order, and how they are invoked."""

    mode: ExecutionMode
    containers: tuple[ContainerTemplate, ...]

    @classmethod
    def of(cls, model: Model) -> GroupTemplate:
        return cls(
            mode=model.execution_mode,
            containers=tuple(_container(c, n) for n, c in enumerate(model.containers, start=1)),
        )


def _container(raw: dict[str, Any], position: int) -> ContainerTemplate:
    hostname = raw.get("ContainerHostname") or None
    return ContainerTemplate(
        name=container_name(hostname, position),
        hostname=hostname,
        image=str(raw["Image"]),
        environment={str(k): str(v) for k, v in (raw.get("Environment") or {}).items()},
        model_url=raw.get("ModelDataUrl") or None,
    )


@dataclass(frozen=True, slots=True)
class GroupSpec(InstanceSpec):
    """An instance that is a group of containers: ``members`` are what the backend starts."""

    members: tuple[InstanceSpec, ...] = ()
    names: tuple[str, ...] = ()
    hostnames: tuple[str | None, ...] = ()
    mode: ExecutionMode = ExecutionMode.SERIAL


def group_spec(base: InstanceSpec, group: GroupTemplate) -> GroupSpec:
    """The spec of one group, from the spec a single-container instance would have.

    ``base.environment`` holds what the gateway adds to every container (S3 endpoint,
    handler threads of a serverless variant, a transform job's variables); each
    container's own Environment is laid over it.
    """
    members = []
    for n, container in enumerate(group.containers, start=1):
        member_id = f"{base.instance_id}-{container.hostname or n}"
        members.append(
            InstanceSpec(
                instance_id=member_id,
                image=container.image,
                model_url=container.model_url,
                environment={**base.environment, **container.environment},
                log_path=base.log_path and base.log_path.with_name(f"{member_id}.log"),
                s3_access=any(
                    (uri or "").startswith("s3://")
                    for uri in (
                        container.model_url,
                        container.environment.get("SAGEMAKER_SUBMIT_DIRECTORY"),
                    )
                ),
                warm=base.warm,
                cpu_nice=base.cpu_nice,
                resources=base.resources and base.resources.split(len(group.containers)),
                hostname=container.hostname,
            )
        )
    return GroupSpec(
        instance_id=base.instance_id,
        image=members[0].image,
        model_url=members[0].model_url,
        environment=members[0].environment,
        log_path=members[0].log_path,
        s3_access=any(m.s3_access for m in members),
        warm=base.warm,
        resources=base.resources,
        members=tuple(members),
        names=tuple(c.name for c in group.containers),
        hostnames=tuple(c.hostname for c in group.containers),
        mode=group.mode,
    )


@dataclass(slots=True)
class GroupHandle:
    """A started group: one handle per container, in order."""

    instance_id: str
    url: str
    """The first container's: what the group answers on for any other path."""
    members: tuple[InstanceHandle, ...]
    spec: GroupSpec
    socket_path: str | None = None
    """A group is reached through its containers' ports (attach)."""

    def __repr__(self) -> str:
        return f"GroupHandle(id={self.instance_id!r}, containers={list(self.spec.names)})"

    def attach(self, instance: Instance) -> None:
        """Make ``instance`` (the router's view of the group) send through its containers."""
        instance.pool.close()
        instance.pool = ContainerGroupPool(
            [
                Container(name, hostname, handle.url)
                for name, hostname, handle in zip(
                    self.spec.names, self.spec.hostnames, self.members, strict=True
                )
            ],
            direct=self.spec.mode is ExecutionMode.DIRECT,
        )


class ContainerGroups:
    """A Backend that starts a GroupSpec as one process per container on ``backend``,
    and passes every other spec and handle through unchanged."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def __repr__(self) -> str:
        return repr(self.backend)

    async def start(self, spec: InstanceSpec) -> InstanceHandle:
        if not isinstance(spec, GroupSpec):
            return await self.backend.start(spec)
        started = await asyncio.gather(
            *(self.backend.start(m) for m in spec.members), return_exceptions=True
        )
        handles = [h for h in started if not isinstance(h, BaseException)]
        failed = [e for e in started if isinstance(e, BaseException)]
        if failed:
            # One container could not start: the group cannot serve; leave nothing behind.
            await asyncio.gather(*(self.backend.stop(h, timeout_s=5.0) for h in handles))
            raise failed[0]
        return GroupHandle(spec.instance_id, handles[0].url, tuple(handles), spec)

    async def stop(self, handle: InstanceHandle, *, timeout_s: float = 10.0) -> None:
        if not isinstance(handle, GroupHandle):
            await self.backend.stop(handle, timeout_s=timeout_s)
            return
        await asyncio.gather(*(self.backend.stop(m, timeout_s=timeout_s) for m in handle.members))

    def exit_reason(self, handle: InstanceHandle) -> str | None:
        """The first container that has stopped, named, and why: the group is restarted
        whole, since a pipeline is no use without any one of its steps."""
        if not isinstance(handle, GroupHandle):
            return self.backend.exit_reason(handle)
        for name, member in zip(handle.spec.names, handle.members, strict=True):
            reason = self.backend.exit_reason(member)
            if reason is not None:
                return f"{name}: {reason}"
        return None

    def memory_bytes(self, handle: InstanceHandle) -> int | None:
        used = self._summed(handle, self.backend.memory_bytes)
        return None if used is None else int(used)

    def cpu_seconds(self, handle: InstanceHandle) -> float | None:
        return self._summed(handle, self.backend.cpu_seconds)

    @staticmethod
    def _summed(
        handle: InstanceHandle, measure: Callable[[InstanceHandle], float | None]
    ) -> float | None:
        """``measure`` of an instance, or added up over a group's containers; None when
        any of them is unknown."""
        if not isinstance(handle, GroupHandle):
            return measure(handle)
        total = 0.0
        for member in handle.members:
            used = measure(member)
            if used is None:
                return None
            total += used
        return total
