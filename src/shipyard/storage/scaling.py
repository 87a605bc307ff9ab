"""ScalingStore: scalable targets, their policies and their scaling activities.

Application Auto Scaling's state. A scaling step changes an endpoint's
desired instance count and starts its activity in one transaction
(``MetadataStore.change_endpoint(..., also=...)`` with ``start_activity``); the step's end
is recorded with its event in another (``finish_activity``), so what DescribeScalingActivities
shows and what topics hear never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update

from shipyard.records import (
    ActivityStatus,
    Event,
    ScalableTarget,
    ScalingActivity,
    ScalingPolicy,
)
from shipyard.storage import tables as t
from shipyard.storage.events import record_event
from shipyard.storage.transactions import transaction


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def resource_id(endpoint: str, variant: str) -> str:
    return f"endpoint/{endpoint}/variant/{variant}"


def parse_resource_id(value: str) -> tuple[str, str] | None:
    """(endpoint, variant) of ``endpoint/<name>/variant/<variant>``, or None."""
    parts = value.split("/")
    if len(parts) != 4 or parts[0] != "endpoint" or parts[2] != "variant":
        return None
    if not parts[1] or not parts[3]:
        return None
    return parts[1], parts[3]


class ScalingStore:
    """Targets, policies and activities in the metadata store's database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"ScalingStore({self.engine.url.render_as_string(hide_password=True)!r})"

    # -- targets ----------------------------------------------------------------------

    def put_target(self, target: ScalableTarget) -> None:
        """Insert ``target`` or replace the one with its ResourceId."""
        row = {
            "resource_id": target.resource_id,
            "arn": target.arn,
            "min_capacity": target.min_capacity,
            "max_capacity": target.max_capacity,
            "role_arn": target.role_arn,
            "suspended": dict(target.suspended),
            "created": target.created,
        }
        with transaction(self.engine) as conn:
            found = conn.execute(
                update(t.scalable_targets)
                .where(t.scalable_targets.c.resource_id == target.resource_id)
                .values(**row)
            )
            if found.rowcount == 0:
                conn.execute(insert(t.scalable_targets).values(**row))

    def get_target(self, resource: str) -> ScalableTarget | None:
        table = t.scalable_targets
        with transaction(self.engine) as conn:
            row = conn.execute(select(table).where(table.c.resource_id == resource)).mappings()
            found = row.first()
        return None if found is None else _target(found)

    def list_targets(self) -> list[ScalableTarget]:
        table = t.scalable_targets
        with transaction(self.engine) as conn:
            rows = conn.execute(select(table).order_by(table.c.created)).mappings().all()
        return [_target(r) for r in rows]

    def delete_target(self, resource: str) -> bool:
        """Remove the target and its policies; whether there was one."""
        with transaction(self.engine) as conn:
            conn.execute(
                delete(t.scaling_policies).where(t.scaling_policies.c.resource_id == resource)
            )
            gone = conn.execute(
                delete(t.scalable_targets).where(t.scalable_targets.c.resource_id == resource)
            )
        return gone.rowcount > 0

    # -- policies ---------------------------------------------------------------------

    def put_policy(self, policy: ScalingPolicy) -> ScalingPolicy:
        """Insert ``policy`` or replace the one of its name on its target (keeping its ARN
        and creation time, as PutScalingPolicy does); the policy as stored."""
        table = t.scaling_policies
        where = (table.c.resource_id == policy.resource_id) & (table.c.name == policy.name)
        with transaction(self.engine) as conn:
            current = conn.execute(select(table).where(where)).mappings().first()
            if current is not None:
                conn.execute(
                    update(table)
                    .where(where)
                    .values(policy_type=policy.policy_type, config=policy.config)
                )
                stored = {**current, "policy_type": policy.policy_type, "config": policy.config}
                return _policy(stored)
            conn.execute(insert(table).values(**_policy_row(policy)))
        return policy

    def list_policies(self, resource: str | None = None) -> list[ScalingPolicy]:
        table = t.scaling_policies
        query = select(table).order_by(table.c.created, table.c.name)
        if resource is not None:
            query = query.where(table.c.resource_id == resource)
        with transaction(self.engine) as conn:
            rows = conn.execute(query).mappings().all()
        return [_policy(r) for r in rows]

    def delete_policy(self, resource: str, name: str) -> bool:
        table = t.scaling_policies
        with transaction(self.engine) as conn:
            gone = conn.execute(
                delete(table).where((table.c.resource_id == resource) & (table.c.name == name))
            )
        return gone.rowcount > 0

    # -- activities -------------------------------------------------------------------

    @staticmethod
    def start_activity(conn: Connection, activity: ScalingActivity) -> None:
        """Record ``activity`` inside the caller's transaction (the endpoint change)."""
        conn.execute(insert(t.scaling_activities).values(**_activity_row(activity)))

    def record_activity(self, activity: ScalingActivity, event: Event | None = None) -> None:
        """Record an activity that starts and ends at once (a refused step), with its event."""
        with transaction(self.engine) as conn:
            self.start_activity(conn, activity)
            if event is not None:
                record_event(conn, event)

    def finish_activity(
        self,
        activity_id: str,
        *,
        status: ActivityStatus,
        message: str | None,
        ended: datetime,
        event: Event | None,
    ) -> bool:
        """End an InProgress activity and record its event, in one transaction; whether
        it was still in progress (a second finisher changes nothing)."""
        table = t.scaling_activities
        with transaction(self.engine) as conn:
            done = conn.execute(
                update(table)
                .where(table.c.activity_id == activity_id)
                .where(table.c.status == ActivityStatus.IN_PROGRESS.value)
                .values(status=status.value, status_message=message, ended=ended)
            )
            if done.rowcount and event is not None:
                record_event(conn, event)
        return bool(done.rowcount)

    def list_activities(self, resource: str | None = None) -> list[ScalingActivity]:
        """Newest first."""
        table = t.scaling_activities
        query = select(table).order_by(table.c.seq.desc())
        if resource is not None:
            query = query.where(table.c.resource_id == resource)
        with transaction(self.engine) as conn:
            rows = conn.execute(query).mappings().all()
        return [_activity(r) for r in rows]

    def open_activities(self) -> list[ScalingActivity]:
        table = t.scaling_activities
        query = select(table).where(table.c.status == ActivityStatus.IN_PROGRESS.value)
        with transaction(self.engine) as conn:
            rows = conn.execute(query.order_by(table.c.seq)).mappings().all()
        return [_activity(r) for r in rows]

    def last_activity_times(self) -> dict[str, datetime]:
        """Per ResourceId, when its newest activity started (cooldowns survive a restart)."""
        table = t.scaling_activities
        latest: dict[str, datetime] = {}
        with transaction(self.engine) as conn:
            for resource, started in conn.execute(select(table.c.resource_id, table.c.started)):
                stamp = _utc(started)
                assert stamp is not None
                if resource not in latest or stamp > latest[resource]:
                    latest[resource] = stamp
        return latest


def component_of(resource: str) -> str | None:
    """The inference component ``inference-component/<name>`` names, or None."""
    kind, _, name = resource.partition("/")
    return name if kind == "inference-component" and name and "/" not in name else None


def _target(row: Any) -> ScalableTarget:
    component = component_of(row["resource_id"])
    endpoint, variant = parse_resource_id(row["resource_id"]) or ("", component or "")
    created = _utc(row["created"])
    assert created is not None
    return ScalableTarget(
        resource_id=row["resource_id"],
        endpoint=endpoint,
        variant=variant,
        arn=row["arn"],
        min_capacity=int(row["min_capacity"]),
        max_capacity=int(row["max_capacity"]),
        role_arn=row["role_arn"],
        created=created,
        suspended={k: bool(v) for k, v in (row["suspended"] or {}).items()},
        component=component,
    )


def _policy_row(policy: ScalingPolicy) -> dict[str, Any]:
    return {
        "resource_id": policy.resource_id,
        "name": policy.name,
        "arn": policy.arn,
        "policy_type": policy.policy_type,
        "config": policy.config,
        "created": policy.created,
    }


def _policy(row: Any) -> ScalingPolicy:
    created = _utc(row["created"])
    assert created is not None
    return ScalingPolicy(
        name=row["name"],
        resource_id=row["resource_id"],
        arn=row["arn"],
        policy_type=row["policy_type"],
        config=dict(row["config"] or {}),
        created=created,
    )


def _activity_row(a: ScalingActivity) -> dict[str, Any]:
    return {
        "activity_id": a.activity_id,
        "resource_id": a.resource_id,
        "description": a.description,
        "cause": a.cause,
        "started": a.started,
        "ended": a.ended,
        "status": a.status.value,
        "status_message": a.status_message,
        "from_count": a.from_count,
        "to_count": a.to_count,
    }


def _activity(row: Any) -> ScalingActivity:
    started = _utc(row["started"])
    assert started is not None
    return ScalingActivity(
        activity_id=row["activity_id"],
        resource_id=row["resource_id"],
        description=row["description"],
        cause=row["cause"],
        started=started,
        ended=_utc(row["ended"]),
        status=ActivityStatus(row["status"]),
        status_message=row["status_message"],
        from_count=int(row["from_count"]),
        to_count=int(row["to_count"]),
    )


def policies_by_target(policies: Sequence[ScalingPolicy]) -> dict[str, list[ScalingPolicy]]:
    grouped: dict[str, list[ScalingPolicy]] = {}
    for policy in policies:
        grouped.setdefault(policy.resource_id, []).append(policy)
    return grouped
