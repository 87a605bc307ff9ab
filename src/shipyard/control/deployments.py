"""Safe deployments: an UpdateEndpoint with a DeploymentConfig, carried out step by step
and rolled back by itself when an alarm fires.

``plan`` turns a DeploymentConfig into steps; ``check`` refuses one that cannot be
carried out. ``Deployer.run`` carries one out, with the old fleet serving throughout:

- blue/green: the whole new fleet is started beside the old one; its share of the
  traffic follows the steps (``ALL_AT_ONCE``: all of it; ``CANARY``: the canary's share
  of the capacity, then all; ``LINEAR``: one step's share more each time), each step
  followed by ``WaitIntervalInSeconds`` of baking; once all traffic is on the new fleet,
  ``TerminationWaitInSeconds`` more, then the old fleet drains and stops;
- rolling: ``MaximumBatchSize`` new instances at a time, each batch taking the traffic
  of as many old ones, which then drain and stop; ``WaitIntervalInSeconds`` between
  batches.

Throughout, every second, the ``AutoRollbackConfiguration`` alarms are read: one in
``ALARM`` (or the deployment outliving ``MaximumExecutionTimeoutInSeconds``) moves all
traffic back to the old fleet (``RollingBack``), restores the instances a rolling update
had stopped, stops the new ones, and leaves the endpoint ``InService`` on its old
config with a FailureReason naming the alarm. A shift is one routing table swapped for
another and a fleet is stopped only once drained, so no request fails because of a step
or a rollback. A gateway restarted mid-deployment starts the old fleet again and runs
the deployment from its first step (the time limit still counts from its start).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from shipyard.errors import FleetFailed, InvalidParameter
from shipyard.events.kinds import deployment_event
from shipyard.provisioning.fleet import Fleet, Provisioner, Slot
from shipyard.records import Endpoint, EndpointConfig, EndpointStatus
from shipyard.storage.events import record_event
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.metrics import MetricStore

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 28_800
"""MaximumExecutionTimeoutInSeconds when it is left out: the most AWS allows."""

POLL_S = 1.0
"""How often a baking deployment reads its alarms."""


@dataclass(frozen=True, slots=True)
class Plan:
    rolling: bool
    shares: tuple[float, ...]
    """Blue/green: the new fleet's share of the traffic at each step, the last 1.0."""
    batch: int
    """Rolling: new instances per batch, per variant."""
    wait_s: float
    termination_wait_s: float
    timeout_s: float
    alarms: tuple[str, ...]


def capacity(config: EndpointConfig) -> int:
    """The instances a deployment moves: the production variants' counts."""
    return sum(v.instance_count for v in config.variants if not v.shadow)


def _size(spec: dict[str, Any], fleet: int) -> float:
    """A CanarySize, LinearStepSize or MaximumBatchSize as a share of ``fleet``."""
    value = float(spec["Value"])
    if spec["Type"] == "INSTANCE_COUNT":
        return value / max(fleet, 1)
    return value / 100.0


ALL_AT_ONCE: dict[str, Any] = {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE"}}
"""The policy of a DeploymentConfig that names none (only AutoRollbackConfiguration): "If
no update policy is specified, SageMaker uses a blue/green deployment strategy with all at
once traffic shifting by default" (botocore)."""


def plan(deployment: dict[str, Any], fleet: int) -> Plan:
    alarms = tuple(
        a["AlarmName"]
        for a in (deployment.get("AutoRollbackConfiguration") or {}).get("Alarms") or ()
    )
    rolling = deployment.get("RollingUpdatePolicy")
    if rolling is not None:
        share = _size(rolling["MaximumBatchSize"], fleet)
        return Plan(
            rolling=True,
            shares=(),
            batch=max(1, math.ceil(round(share * fleet, 9))),
            wait_s=float(rolling["WaitIntervalInSeconds"]),
            termination_wait_s=0.0,
            timeout_s=float(rolling.get("MaximumExecutionTimeoutInSeconds", DEFAULT_TIMEOUT_S)),
            alarms=alarms,
        )
    policy = deployment.get("BlueGreenUpdatePolicy") or ALL_AT_ONCE
    routing = policy["TrafficRoutingConfiguration"]
    kind = routing["Type"]
    if kind == "CANARY":
        first = min(_size(routing["CanarySize"], fleet), 1.0)
        shares: tuple[float, ...] = (first, 1.0) if first < 1.0 else (1.0,)
    elif kind == "LINEAR":
        step = min(_size(routing["LinearStepSize"], fleet), 1.0)
        count = math.ceil(round(1.0 / step, 9))
        shares = tuple(min(step * (k + 1), 1.0) for k in range(count))
    else:
        shares = (1.0,)
    return Plan(
        rolling=False,
        shares=shares,
        batch=0,
        wait_s=float(routing.get("WaitIntervalInSeconds", 0)),
        termination_wait_s=float(policy.get("TerminationWaitInSeconds", 0)),
        timeout_s=float(policy.get("MaximumExecutionTimeoutInSeconds", DEFAULT_TIMEOUT_S)),
        alarms=alarms,
    )


def deploys(deployment: dict[str, Any]) -> bool:
    """Whether a DeploymentConfig asks for a deployment carried out step by step: a policy,
    or alarms alone (then blue/green, all at once: ALL_AT_ONCE)."""
    alarms = (deployment.get("AutoRollbackConfiguration") or {}).get("Alarms")
    return bool(
        deployment.get("BlueGreenUpdatePolicy") or deployment.get("RollingUpdatePolicy") or alarms
    )


def check(
    deployment: dict[str, Any], config: EndpointConfig, known_alarm: Callable[[str], bool]
) -> None:
    """Refuse a DeploymentConfig ``config`` cannot be deployed with, naming the field."""
    blue_green = deployment.get("BlueGreenUpdatePolicy")
    rolling = deployment.get("RollingUpdatePolicy")
    if blue_green is not None and rolling is not None:
        raise InvalidParameter(
            "DeploymentConfig takes BlueGreenUpdatePolicy or RollingUpdatePolicy, not both."
        )
    if deploys(deployment) and (
        config.hosts_components or any(v.serverless is not None for v in config.variants)
    ):
        raise InvalidParameter(
            f"Endpoint configuration {config.name} has serverless variants or hosts inference "
            "components: it is deployed all at once, without a DeploymentConfig policy or "
            "alarms."
        )
    fleet = capacity(config)
    for field, spec in _sizes(blue_green, rolling):
        value = int(spec["Value"])
        if spec["Type"] == "INSTANCE_COUNT" and value > fleet:
            raise InvalidParameter(
                f"DeploymentConfig {field} of {value} instances is larger than the fleet of "
                f"endpoint configuration {config.name} ({fleet} instances)."
            )
        if spec["Type"] == "CAPACITY_PERCENT" and value > 100:
            raise InvalidParameter(
                f"DeploymentConfig {field} of {value} percent is more than 100 percent."
            )
    alarms = (deployment.get("AutoRollbackConfiguration") or {}).get("Alarms") or ()
    for index, alarm in enumerate(alarms, 1):
        if not alarm.get("AlarmName"):
            # Optional in botocore's Alarm shape, so its validation lets an empty one by.
            raise InvalidParameter(
                f"DeploymentConfig.AutoRollbackConfiguration.Alarms: alarm {index} names no "
                "AlarmName."
            )
        if not known_alarm(alarm["AlarmName"]):
            raise InvalidParameter(
                f"DeploymentConfig.AutoRollbackConfiguration.Alarms: alarm {alarm['AlarmName']} "
                "does not exist (create it with PutMetricAlarm first)."
            )


def _sizes(
    blue_green: dict[str, Any] | None, rolling: dict[str, Any] | None
) -> list[tuple[str, dict[str, Any]]]:
    """The sizes a DeploymentConfig gives, by field; a size its Type needs is required."""
    sizes: list[tuple[str, dict[str, Any]]] = []
    if blue_green is not None:
        routing = blue_green["TrafficRoutingConfiguration"]
        for field, kind in (("CanarySize", "CANARY"), ("LinearStepSize", "LINEAR")):
            where = f"BlueGreenUpdatePolicy.TrafficRoutingConfiguration.{field}"
            if routing["Type"] == kind and routing.get(field) is None:
                raise InvalidParameter(f"DeploymentConfig.{where} is required with Type {kind}.")
            if routing.get(field) is not None:
                sizes.append((where, routing[field]))
    if rolling is not None:
        for field in ("MaximumBatchSize", "RollbackMaximumBatchSize"):
            if rolling.get(field) is not None:
                sizes.append((f"RollingUpdatePolicy.{field}", rolling[field]))
    return sizes


class RolledBack(Exception):
    """Why a deployment stopped and its traffic went back to the old fleet."""


class Deployer:
    """Carries out one endpoint's deployment (see the module)."""

    def __init__(
        self,
        *,
        store: MetadataStore,
        provisioner: Provisioner,
        publisher: Any,
        scale_out: Callable[[str, Fleet, str, int], Awaitable[None]],
        change: Callable[..., Awaitable[None]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.alarms = MetricStore(store.engine)
        self.provisioner = provisioner
        self.publisher = publisher
        self.scale_out = scale_out
        self.change = change
        self.clock = clock
        self._restore_failed: dict[str, str] = {}
        """Per endpoint, why a rolling update's rollback could not start its old
        instances again (the endpoint is then UpdateRollbackFailed)."""
        self.notify: tuple[str, ...] = ()
        """Topics told how each deployment ends (the stack file's ``deployments.notify``)."""
        self.on_event: Callable[[], None] = lambda: None

    def recording(
        self, ep: Endpoint, config: str, state: str, reason: str = ""
    ) -> Callable[[Connection], None]:
        """What records the deployment's end with the endpoint's change (one
        transaction), whether or not any topic is to hear of it."""
        started = float((ep.deployment or {}).get("started") or self.clock())
        event = deployment_event(
            endpoint=ep.name,
            arn=ep.arn,
            config=self.store.shown_config_name(config),
            state=state,
            reason=reason,
            started=started,
            at=datetime.now(UTC),
            topics=self.notify,
        )

        def record(conn: Connection) -> None:
            record_event(conn, event)

        return record

    def __repr__(self) -> str:
        return "Deployer()"

    async def run(self, ep: Endpoint, config: EndpointConfig, old: Fleet) -> Fleet | None:
        """Deploy ``config`` over ``old``; the fleet now serving the endpoint's config,
        ``None`` when it rolled back (``old`` serves, the endpoint records why)."""
        deployment = ep.deployment or {}
        steps = plan(deployment["config"], capacity(config))
        started = float(deployment.get("started") or self.clock())
        try:
            if steps.rolling:
                return await self._rolling(ep, config, old, steps, started)
            return await self._blue_green(ep, config, old, steps, started)
        except RolledBack as why:
            await self._rolled_back(ep, config, str(why), self._restore_failed.pop(ep.name, None))
            return None

    # -- blue/green -------------------------------------------------------------------

    async def _blue_green(
        self, ep: Endpoint, config: EndpointConfig, old: Fleet, steps: Plan, started: float
    ) -> Fleet:
        new = await self._launch(ep, config, {v.name: v.instance_count for v in config.variants})
        try:
            for share in steps.shares:
                self.publisher.blend(old, new, share)
                await self._progress(ep, share, "Baking")
                await self._bake(ep, steps, started, steps.wait_s)
            await self._progress(ep, 1.0, "Baking")
            await self._bake(ep, steps, started, steps.termination_wait_s)
        except BaseException:
            self.publisher.blend(old, new, 0.0)
            self.publisher.unblend(old)
            await self.provisioner.drain_and_stop(new.all_slots())
            raise
        self.publisher.unblend(new)
        return new

    # -- rolling ----------------------------------------------------------------------

    async def _rolling(
        self, ep: Endpoint, config: EndpointConfig, old: Fleet, steps: Plan, started: float
    ) -> Fleet:
        wanted = {v.name: v.instance_count for v in config.variants}
        first = {name: min(steps.batch, count) for name, count in wanted.items()}
        new = await self._launch(ep, config, first)
        retired: list[tuple[str, Slot]] = []
        try:
            while True:
                await self._retire_old(old, new, wanted, retired)
                await self._progress(ep, _share(old, new), "Baking")
                await self._bake(ep, steps, started, steps.wait_s)
                left = {n: wanted[n] - len(new.slots.get(n, [])) for n in wanted}
                if not any(count > 0 for count in left.values()):
                    break
                for name, count in left.items():
                    if count > 0:
                        await self.scale_out(ep.name, new, name, min(steps.batch, count))
                self.publisher.blend(old, new, _share(old, new))
        except BaseException:
            await self._restore(ep, old, new, retired)
            raise
        self.publisher.unblend(new)
        return new

    async def _retire_old(
        self,
        old: Fleet,
        new: Fleet,
        wanted: dict[str, int],
        retired: list[tuple[str, Slot]],
    ) -> None:
        """Stop as many old instances as the new fleet has taken over, the traffic shifted
        to the new ones first."""
        stopping: list[Slot] = []
        for name, slots in old.slots.items():
            if name not in wanted:
                continue
            keep = max(wanted[name] - len(new.slots.get(name, [])), 0)
            for slot in slots[keep:]:
                stopping.append(slot)
                retired.append((name, slot))
            del slots[keep:]
        self.publisher.blend(old, new, _share(old, new))
        await self.provisioner.drain_and_stop(stopping)

    async def _restore(
        self, ep: Endpoint, old: Fleet, new: Fleet, retired: list[tuple[str, Slot]]
    ) -> None:
        """Roll a rolling update back: the old fleet's stopped instances started again,
        then all traffic on it and the new instances stopped."""
        missing: dict[str, int] = {}
        for name, _ in retired:
            missing[name] = missing.get(name, 0) + 1
        for name, count in missing.items():
            try:
                await self.scale_out(ep.name, old, name, count)
            except FleetFailed as exc:
                log.warning("rolling back %s: restarting old instances failed: %s", ep.name, exc)
                self._restore_failed[ep.name] = (
                    f"starting {count} instance(s) of variant {name} again failed: {exc}"
                )
        self.publisher.blend(old, new, 0.0)
        self.publisher.unblend(old)
        await self.provisioner.drain_and_stop(new.all_slots())

    # -- shared -----------------------------------------------------------------------

    async def _launch(self, ep: Endpoint, config: EndpointConfig, counts: dict[str, int]) -> Fleet:
        weights = {v.name: v.weight for v in config.variants}
        await self._progress(ep, 0.0, "Creating")
        return await self.provisioner.launch(ep.name, config, counts, weights, adoptable=True)

    async def _progress(self, ep: Endpoint, share: float, stage: str) -> None:
        """Record the step reached (DescribeEndpoint's PendingDeploymentSummary)."""
        deployment = {**(ep.deployment or {}), "share": round(share, 6), "stage": stage}
        deployment["since"] = self.clock()
        await self.change(ep.name, deployment=deployment, generation=ep.generation)

    async def _bake(self, ep: Endpoint, steps: Plan, started: float, seconds: float) -> None:
        """Wait ``seconds`` with the alarms watched; RolledBack when one fires, the time
        limit passes or the endpoint is being deleted."""
        until = self.clock() + seconds
        while True:
            await self._watch(ep, steps, started)
            left = until - self.clock()
            if left <= 0:
                return
            await asyncio.sleep(min(POLL_S, left))

    async def _watch(self, ep: Endpoint, steps: Plan, started: float) -> None:
        if self.clock() - started > steps.timeout_s:
            await self._rolling_back(ep)
            raise RolledBack(
                f"The deployment did not complete within MaximumExecutionTimeoutInSeconds "
                f"({steps.timeout_s:g} s)."
            )
        firing = await asyncio.to_thread(self._firing, steps.alarms)
        if firing is not None:
            await self._rolling_back(ep)
            raise RolledBack(firing)
        current = await asyncio.to_thread(self.store.get_endpoint, ep.name)
        if current.status is EndpointStatus.DELETING:
            raise asyncio.CancelledError  # the delete step takes over

    async def _rolling_back(self, ep: Endpoint) -> None:
        deployment = {**(ep.deployment or {}), "stage": "RollingBack", "since": self.clock()}
        await self.change(
            ep.name,
            status=EndpointStatus.ROLLING_BACK,
            deployment=deployment,
            generation=ep.generation,
        )

    def _firing(self, alarms: tuple[str, ...]) -> str | None:
        for name in alarms:
            alarm = self.alarms.get_alarm(name)
            if alarm is not None and alarm.state == "ALARM":
                return f"Alarm {name} went into ALARM state during the deployment: {alarm.reason}"
        return None

    async def _rolled_back(
        self, ep: Endpoint, config: EndpointConfig, why: str, failed: str | None
    ) -> None:
        log.warning("deployment of %s to %s rolled back: %s", ep.name, config.name, why)
        reason = f"Update to endpoint configuration {config.name} was rolled back: {why}"
        if failed is not None:
            reason += f" The rollback did not complete: {failed}"
        if failed is None:
            await self.ended(ep, config.name, "RolledBack", reason)
        else:
            await self.ended(
                ep,
                config.name,
                "UpdateRollbackFailed",
                reason,
                status=EndpointStatus.UPDATE_ROLLBACK_FAILED,
            )

    async def ended(
        self,
        ep: Endpoint,
        config: str,
        state: str,
        reason: str,
        *,
        status: EndpointStatus = EndpointStatus.IN_SERVICE,
    ) -> None:
        """A deployment that did not complete: the endpoint back on its old config with
        ``reason``, and topics told (``state``), in one transaction."""
        also = self.recording(ep, config, state, reason)
        await self.change(
            ep.name,
            status=status,
            pending_config_name=None,
            retained=None,
            deployment=None,
            failure_reason=reason,
            also=also,
        )
        if self.notify:
            self.on_event()


def _share(old: Fleet, new: Fleet) -> float:
    """The new fleet's share of the traffic: its share of the instances."""
    counts = [len(s) for s in new.slots.values()], [len(s) for s in old.slots.values()]
    ours, theirs = sum(counts[0]), sum(counts[1])
    return ours / (ours + theirs) if ours + theirs else 1.0


def retain(config: EndpointConfig, retained: dict[str, dict[str, Any]] | None) -> EndpointConfig:
    """``config`` as an update with these ``retained`` properties runs it
    (Endpoint.retained: RetainAllVariantProperties): its variants' counts and weights
    those the endpoint kept."""
    if not retained:
        return config
    variants = []
    for variant in config.variants:
        kept = retained.get(variant.name) or {}
        variants.append(
            replace(
                variant,
                instance_count=int(kept.get("count", variant.instance_count)),
                weight=float(kept.get("weight", variant.weight)),
            )
        )
    return replace(config, variants=tuple(variants))
