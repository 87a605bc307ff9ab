"""Placement: packing inference-component copies onto a variant's instances.

Each instance of a variant of components has its InstanceType's vCPUs and memory
(instance_types.py); each copy reserves its component's NumberOfCpuCoresRequired and
MinMemoryRequiredInMb. Copies are placed first fit, components in the order they were
created, so a component already running keeps its room when a newer one asks for more
than is left. With ManagedInstanceScaling the variant may add instances (up to its
MaxInstanceCount) for copies that fit on none, and keeps only those it uses (at least
MinInstanceCount); without it, it has its InitialInstanceCount, used or not.

Pure: the reconciler asks on every change and starts or stops copies to match.
Written here rather than taken from a bin-packing library: the problem is a few dozen
copies of a handful of sizes, and the order rules (older components first, stable
results) are the domain's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shipyard.instance_types import INSTANCE_TYPES, InstanceType

_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Demand:
    """The copies one component wants, and what each reserves."""

    component: str
    copies: int
    cpus: float
    memory_mb: int


@dataclass(slots=True)
class Placement:
    hosts: int
    """Instances the variant has: those it needs, within its bounds."""
    placed: dict[str, list[int]] = field(default_factory=dict)
    """Per component: the instance (index) of each copy that fits."""
    short: dict[str, int] = field(default_factory=dict)
    """Per component: copies wanted that fit on no instance."""

    def copies(self, component: str) -> int:
        return len(self.placed.get(component, ()))


@dataclass(slots=True)
class _Host:
    cpus: float
    memory: int


def capacity_of(instance_type: str) -> InstanceType | None:
    """The vCPUs and memory of one instance; None for a type not in the table (its
    copies are then placed without counting)."""
    return INSTANCE_TYPES.get(instance_type)


def fits_one(instance_type: str, cpus: float, memory_mb: int) -> bool:
    """Whether one copy needing this fits on an empty instance of ``instance_type``."""
    size = capacity_of(instance_type)
    return size is None or (cpus <= size.vcpus and memory_mb * _MIB <= size.memory_bytes)


def place(
    instance_type: str,
    demands: list[Demand],
    *,
    least: int,
    most: int,
    keep_all: bool,
) -> Placement:
    """Place ``demands`` (in priority order) on between ``least`` and ``most`` instances.

    ``keep_all``: the variant keeps ``least`` instances whatever it uses (no managed
    scaling: then ``least == most``); else it has only the instances it uses, at least
    ``least``.
    """
    size = capacity_of(instance_type)
    hosts: list[_Host] = []

    def new_host() -> _Host:
        host = (
            _Host(float("inf"), 1 << 62)
            if size is None
            else _Host(float(size.vcpus), size.memory_bytes)
        )
        hosts.append(host)
        return host

    for _ in range(least):
        new_host()
    placement = Placement(hosts=0)
    for demand in demands:
        need_memory = demand.memory_mb * _MIB
        on: list[int] = []
        for _ in range(demand.copies):
            index = next(
                (
                    i
                    for i, h in enumerate(hosts)
                    if h.cpus >= demand.cpus and h.memory >= need_memory
                ),
                None,
            )
            if (
                index is None
                and len(hosts) < most
                and fits_one(instance_type, demand.cpus, demand.memory_mb)
            ):
                new_host()
                index = len(hosts) - 1
            if index is None:
                placement.short[demand.component] = demand.copies - len(on)
                break
            hosts[index].cpus -= demand.cpus
            hosts[index].memory -= need_memory
            on.append(index)
        placement.placed[demand.component] = on
    used = {i for on in placement.placed.values() for i in on}
    placement.hosts = len(hosts) if keep_all else max(least, max(used, default=-1) + 1)
    return placement
