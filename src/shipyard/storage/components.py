"""ComponentStore: inference components, the desired state of what each endpoint of
components hosts (how many copies of which specification).

The control plane writes it (control/components.py); the reconciler reads it and records
what it reached (status, failure reason), and deletes a component once its copies are
gone. Every write that changes a component goes through ``_write`` (or ``create``),
which records the change's events (its status: ``announce``) in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import Update

from shipyard.errors import AlreadyExists, ResourceNotFound
from shipyard.records import (
    ComponentSpec,
    ComponentStatus,
    ComputeRequirements,
    InferenceComponent,
    ServedSpec,
)
from shipyard.storage import tables as t
from shipyard.storage.events import record_event
from shipyard.storage.metadata import AnnounceComponent, MetadataStore, collect_kept
from shipyard.storage.transactions import transaction


def not_found(name: str) -> ResourceNotFound:
    return ResourceNotFound.of("inference component", name)


class ComponentStore:
    """Inference components in the metadata store's database."""

    def __init__(self, engine: Engine, *, announce: AnnounceComponent | None = None) -> None:
        self.engine = engine
        self.announce = announce
        """The events of a component's change (its status), recorded with the change."""

    @classmethod
    def of(cls, store: MetadataStore) -> ComponentStore:
        """The components of ``store``'s database, announced as ``store`` says."""
        return cls(store.engine, announce=store.announce_component)

    def __repr__(self) -> str:
        return f"ComponentStore({self.engine.url.render_as_string(hide_password=True)!r})"

    def create(self, component: InferenceComponent) -> None:
        row = _row(component)
        try:
            with transaction(self.engine) as conn:
                conn.execute(insert(t.inference_components).values(**row))
                self._record(conn, component, None)
        except IntegrityError as exc:
            raise AlreadyExists(
                f'Cannot create already existing inference component "{component.arn}".'
            ) from exc

    def get(self, name: str) -> InferenceComponent:
        table = t.inference_components
        with transaction(self.engine) as conn:
            row = conn.execute(select(table).where(table.c.name == name)).mappings().first()
        if row is None:
            raise not_found(name)
        return _component(row)

    def list(self, endpoint: str | None = None) -> list[InferenceComponent]:
        table = t.inference_components
        query = select(table)
        if endpoint is not None:
            query = query.where(table.c.endpoint == endpoint)
        with transaction(self.engine) as conn:
            rows = conn.execute(query.order_by(table.c.created, table.c.name)).mappings().all()
        return [_component(r) for r in rows]

    def change(
        self,
        name: str,
        *,
        expect: Sequence[ComponentStatus] = (),
        unchanged_since: datetime | None = None,
        also: Callable[[Connection], None] | None = None,
        **changes: Any,
    ) -> bool:
        """Apply ``changes`` (record field names) to the component; False when it is gone,
        or its status is not one of ``expect``, or (``unchanged_since``) it was changed
        after that: then nothing was written. ``also`` writes in the same transaction,
        when the change is made (the autoscaler's activity)."""
        table = t.inference_components
        values = {k: _column_value(k, v) for k, v in changes.items()}
        values["modified"] = datetime.now(UTC)
        query = update(table).where(table.c.name == name)
        if expect:
            query = query.where(table.c.status.in_([s.value for s in expect]))
        if unchanged_since is not None:
            query = query.where(table.c.modified == unchanged_since)
        with transaction(self.engine) as conn:
            changed = self._write(conn, name, query.values(**values))
            if changed and also is not None:
                also(conn)
            if changed and ("spec" in changes or "served" in changes):
                collect_kept(conn)  # a deleted model it no longer runs nor rolls back to
            return changed

    def start_from_zero(self, name: str) -> bool:
        """One copy for a component whose copy count is zero, in service or still being
        scaled down to zero (its copies may be gone before that step records it: the
        step's own record then yields, as it was changed since); whether it was at zero.
        A FailureReason of an earlier update goes, as with UpdateInferenceComponent."""
        table = t.inference_components
        at_zero = [ComponentStatus.IN_SERVICE.value, ComponentStatus.UPDATING.value]
        query = (
            update(table)
            .where(table.c.name == name)
            .where(table.c.copies == 0)
            .where(table.c.status.in_(at_zero))
            .values(
                copies=1,
                status=ComponentStatus.UPDATING.value,
                failure_reason=None,
                modified=datetime.now(UTC),
            )
        )
        with transaction(self.engine) as conn:
            return self._write(conn, name, query)

    def respecify(
        self, name: str, spec: ComponentSpec, raw: dict[str, Any], copies: int | None
    ) -> None:
        """A new specification (and maybe copy count): its copies are to be replaced."""
        table = t.inference_components
        values: dict[str, Any] = {
            "spec": _spec_json(spec),
            "raw": raw,
            "status": ComponentStatus.UPDATING.value,
            "failure_reason": None,
            "modified": datetime.now(UTC),
            "generation": table.c.generation + 1,
        }
        if copies is not None:
            values["copies"] = copies
        live = [ComponentStatus.IN_SERVICE.value, ComponentStatus.CREATING.value,
                ComponentStatus.UPDATING.value]  # fmt: skip
        query = update(table).where(table.c.name == name).where(table.c.status.in_(live))
        with transaction(self.engine) as conn:
            if self._write(conn, name, query.values(**values)):
                collect_kept(conn)  # a deleted model the previous one named
                return
        raise not_found(name)

    def _write(self, conn: Connection, name: str, query: Update) -> bool:
        """Run ``query`` (an UPDATE of the component ``name``) and record the events of
        what it changed; whether it changed the component."""
        previous = self._locked(conn, name)
        if previous is None or not conn.execute(query).rowcount:
            return False
        changed = self._locked(conn, name)
        if changed is not None:
            self._record(conn, changed, previous)
        return True

    def _locked(self, conn: Connection, name: str) -> InferenceComponent | None:
        table = t.inference_components
        query = select(table).where(table.c.name == name)
        if conn.dialect.name == "postgresql":
            query = query.with_for_update()  # what the UPDATE changes is what was read
        row = conn.execute(query).mappings().first()
        return None if row is None else _component(row)

    def _record(
        self, conn: Connection, component: InferenceComponent, previous: InferenceComponent | None
    ) -> None:
        if self.announce is not None:
            for event in self.announce(component, previous):
                record_event(conn, event)

    def delete(self, name: str) -> None:
        table = t.inference_components
        with transaction(self.engine) as conn:
            conn.execute(delete(table).where(table.c.name == name))
            collect_kept(conn)  # a model deleted while the component ran it


def _column_value(key: str, value: Any) -> Any:
    if isinstance(value, ComponentStatus):
        return value.value
    if key == "spec":
        return _spec_json(value)
    if key == "served":
        return _served_json(value)
    return value


def _row(c: InferenceComponent) -> dict[str, Any]:
    return {
        "name": c.name,
        "arn": c.arn,
        "endpoint": c.endpoint,
        "variant": c.variant,
        "spec": _spec_json(c.spec),
        "raw": c.raw,
        "copies": c.copies,
        "status": c.status.value,
        "failure_reason": c.failure_reason,
        "created": c.created,
        "modified": c.modified,
        "generation": c.generation,
        "served": _served_json(c.served),
    }


def _spec_json(spec: ComponentSpec) -> dict[str, Any]:
    out = asdict(spec)
    return out


def _served_json(served: ServedSpec | None) -> dict[str, Any] | None:
    if served is None:
        return None
    return {"spec": _spec_json(served.spec), "raw": served.raw, "generation": served.generation}


def _served(data: dict[str, Any] | None) -> ServedSpec | None:
    if not data:
        return None
    return ServedSpec(_spec(dict(data["spec"])), dict(data["raw"]), int(data["generation"]))


def _spec(data: dict[str, Any]) -> ComponentSpec:
    requirements = data.get("requirements")
    return ComponentSpec(
        model_name=data.get("model_name"),
        image=data.get("image"),
        artifact_url=data.get("artifact_url"),
        environment=dict(data.get("environment") or {}),
        requirements=None if requirements is None else ComputeRequirements(**requirements),
        base=data.get("base"),
        startup_timeout_s=data.get("startup_timeout_s"),
    )


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _component(row: Any) -> InferenceComponent:
    return InferenceComponent(
        name=row["name"],
        arn=row["arn"],
        endpoint=row["endpoint"],
        variant=row["variant"],
        spec=_spec(dict(row["spec"])),
        copies=int(row["copies"]),
        status=ComponentStatus(row["status"]),
        created=_utc(row["created"]),
        modified=_utc(row["modified"]),
        failure_reason=row["failure_reason"],
        raw=dict(row["raw"] or {}),
        generation=int(row["generation"] or 0),
        served=_served(row["served"]),
    )
