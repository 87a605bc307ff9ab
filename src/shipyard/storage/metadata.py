"""MetadataStore: typed methods over SQLAlchemy that return records, never rows.

Synchronous on purpose: control-plane calls are rare and short, and the gateway runs
them in a worker thread, so the data path never waits on the store.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import StaticPool

from shipyard.errors import (
    AlreadyExists,
    InvalidParameter,
    ResourceLimitExceeded,
    ResourceNotFound,
)
from shipyard.records import (
    ENDPOINT_TRANSITIONS,
    AsyncConfig,
    Endpoint,
    EndpointConfig,
    EndpointStatus,
    Event,
    InferenceComponent,
    Model,
    RoutingStrategy,
    ServerlessConfig,
    VariantSpec,
    VariantState,
)
from shipyard.storage import tables as t
from shipyard.storage.events import record_event
from shipyard.storage.transactions import serialize, transaction

log = logging.getLogger(__name__)

Announce = Callable[[Endpoint, Endpoint | None], Sequence[Event]]
"""An endpoint's new record and its previous one (None: created) -> the events it says."""
AnnounceComponent = Callable[[InferenceComponent, InferenceComponent | None], Sequence[Event]]
"""The same for an inference component (storage/components.py)."""

_MIGRATIONS = Path(__file__).parent / "migrations"
_MIGRATION_LOCK = 0x5348_4950_5944
"""The advisory lock migrations take on PostgreSQL ("SHIPYD")."""


def schema_revision() -> str:
    """The newest migration's revision, read from its file's name (``NNNN_*.py``; the
    tests hold every name to its revision). A store already at it is not handed to
    Alembic, whose import is a tenth of a gateway's start."""
    names = (_MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")
    return max(path.name[:4] for path in names)


def _utc(value: datetime) -> datetime:
    # SQLite drops the zone; every timestamp we write is UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


class MetadataStore:
    """Models, endpoint configs and endpoints in SQLite (default) or PostgreSQL."""

    def __init__(
        self,
        url: str,
        *,
        announce: Announce | None = None,
        announce_component: AnnounceComponent | None = None,
    ) -> None:
        self.url = url
        self.engine = _make_engine(url)
        self.announce = announce
        """The events of an endpoint's change (its status, a deployment's step), recorded
        with the change in its transaction: every endpoint write goes through
        ``create_endpoint`` or ``change_endpoint``, so none is missed."""
        self.announce_component = announce_component
        """The same for an inference component's change (its status), which the
        component store (``ComponentStore.of``) records with each of its writes."""

    def __repr__(self) -> str:
        return f"MetadataStore({self.engine.url.render_as_string(hide_password=True)!r})"

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision; safe to call on every start.

        On PostgreSQL gateways starting together take turns (an advisory lock held until
        the migration commits): two creating the same tables at once would fail one. A
        store at :func:`schema_revision` already is left as it is, without Alembic.
        """
        if self.revision() == schema_revision():
            return
        from alembic import command
        from alembic.config import Config as AlembicConfig

        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        with transaction(self.engine) as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def revision(self) -> str | None:
        """The Alembic revision the store is at; None for a new store."""
        with transaction(self.engine) as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            found = conn.execute(text("SELECT version_num FROM alembic_version")).all()
        return str(found[0][0]) if len(found) == 1 else None

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with transaction(self.engine) as conn:
            yield conn

    # -- models ---------------------------------------------------------------------------

    def create_model(self, model: Model) -> None:
        row = {
            "name": model.name,
            "arn": model.arn,
            "image": model.image,
            "model_data_url": model.model_data_url,
            "environment": model.environment,
            "execution_role_arn": model.execution_role_arn,
            "created": model.created,
            "raw": model.raw,
        }
        self._insert(t.models, row, f'Cannot create already existing model "{model.arn}".')

    def get_model(self, name: str, *, kept: bool = True) -> Model:
        """``kept``: a model deleted while an endpoint runs it is found too (what starts
        that endpoint's instances needs it); the API's callers pass False."""
        query = select(t.models).where(t.models.c.name == name)
        if not kept:
            query = query.where(_live(t.models))
        with self._tx() as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            raise ResourceNotFound.of("model", name)
        return _model(row)

    def list_models(self) -> list[Model]:
        with self._tx() as conn:
            rows = conn.execute(select(t.models).where(_live(t.models))).mappings().all()
        return [_model(r) for r in rows]

    def delete_model(self, name: str) -> None:
        self._retire(t.models, name, "model")

    # -- endpoint configs -----------------------------------------------------------------

    def create_endpoint_config(self, config: EndpointConfig) -> None:
        row = {
            "name": config.name,
            "arn": config.arn,
            "variants": [_variant_json(v) for v in config.variants],
            "created": config.created,
            "raw": config.raw,
            "async_config": _async_json(config.async_config),
        }
        message = f'Cannot create already existing endpoint configuration "{config.arn}".'
        self._insert(t.endpoint_configs, row, message)

    def get_endpoint_config(self, name: str, *, kept: bool = True) -> EndpointConfig:
        """``kept``: as for get_model."""
        table = t.endpoint_configs
        query = select(table).where(table.c.name == name)
        if not kept:
            query = query.where(_live(table))
        with self._tx() as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            raise ResourceNotFound.of("endpoint configuration", name)
        return _endpoint_config(row)

    def list_endpoint_configs(self) -> list[EndpointConfig]:
        table = t.endpoint_configs
        with self._tx() as conn:
            rows = conn.execute(select(table).where(_live(table))).mappings().all()
        return [_endpoint_config(r) for r in rows]

    def delete_endpoint_config(self, name: str) -> None:
        self._retire(t.endpoint_configs, name, "endpoint configuration")

    def shown_config_name(self, name: str) -> str:
        """The name an endpoint's config is described by: its own, unless it was
        deleted and its name taken by a new config (``_make_room``), which leaves it a
        hidden one."""
        if not name.startswith(_HIDDEN):
            return name
        try:
            return str(self.get_endpoint_config(name).raw.get("EndpointConfigName", name))
        except ResourceNotFound:
            return name

    # -- endpoints ------------------------------------------------------------------------

    def create_endpoint(
        self, endpoint: Endpoint, *, max_endpoints: int, events: Sequence[Event] = ()
    ) -> None:
        """Insert ``endpoint`` within the quota, with its ``events`` in the same transaction."""
        row = _endpoint_row(endpoint)
        message = f'Cannot create already existing endpoint "{endpoint.arn}".'
        with self._tx() as conn:
            count = conn.execute(select(func.count()).select_from(t.endpoints)).scalar_one()
            if count >= max_endpoints:
                raise ResourceLimitExceeded(
                    f"The account-level service limit 'Number of endpoints' is {max_endpoints} "
                    f"Endpoints, with current utilization of {count} Endpoints and a request "
                    "delta of 1 Endpoints."
                )
            try:
                conn.execute(insert(t.endpoints).values(**row))
            except IntegrityError as exc:
                raise AlreadyExists(message) from exc
            for event in [*events, *self._announced(endpoint, None)]:
                record_event(conn, event)

    def _announced(self, endpoint: Endpoint, previous: Endpoint | None) -> Sequence[Event]:
        return () if self.announce is None else self.announce(endpoint, previous)

    def get_endpoint(self, name: str) -> Endpoint:
        with self._tx() as conn:
            return self._get_endpoint(conn, name)

    def list_endpoints(self) -> list[Endpoint]:
        with self._tx() as conn:
            rows = conn.execute(select(t.endpoints)).mappings().all()
        return [_endpoint(r) for r in rows]

    def change_endpoint(
        self,
        name: str,
        *,
        expect: Sequence[EndpointStatus] | None = None,
        also: Callable[[Connection], None] | None = None,
        **changes: Any,
    ) -> Endpoint:
        """Apply ``changes`` to one endpoint in one transaction and return the new record.

        A change of ``status`` must be an allowed transition (ENDPOINT_TRANSITIONS); with
        ``expect``, the current status must be one of those, so two racing callers can't
        both move the same endpoint. ``also`` writes what belongs with the change (a
        scaling activity) in the same transaction.
        """
        with self._tx() as conn:
            current = self._get_endpoint(conn, name, lock=True)
            if expect is not None and current.status not in expect:
                raise InvalidParameter(
                    f'Cannot update endpoint "{current.arn}" while it is {current.status}.'
                )
            new_status = changes.get("status")
            if new_status is not None and new_status != current.status:
                if new_status not in ENDPOINT_TRANSITIONS[current.status]:
                    raise InvalidParameter(
                        f"Endpoint {name} cannot go from {current.status} to {new_status}."
                    )
            promoted = changes.get("config_name")
            pending = current.pending_config_name
            if promoted is not None and pending and pending.startswith(_HIDDEN):
                # The step deploying the pending config read it before the user deleted it
                # and gave its name to a new one (_make_room): it means the one it ran.
                changes["config_name"] = pending
            changed = replace(current, modified=now(), **changes)
            if "generation" not in changes:
                changed = replace(changed, generation=current.generation + 1)
            conn.execute(
                update(t.endpoints)
                .where(t.endpoints.c.name == name)
                .values(**_endpoint_row(changed))
            )
            for event in self._announced(changed, current):
                record_event(conn, event)
            if also is not None:
                also(conn)
            if "config_name" in changes or "pending_config_name" in changes:
                collect_kept(conn)
            return changed

    def delete_endpoint(self, name: str) -> None:
        with self._tx() as conn:
            result = conn.execute(delete(t.endpoints).where(t.endpoints.c.name == name))
            # What gateways said of its serverless use goes with it: an endpoint made
            # again under the name starts with none (storage/serverless_use.py).
            conn.execute(delete(t.serverless_use).where(t.serverless_use.c.endpoint == name))
            # So does its queue of asynchronous requests, as SageMaker drops it: one made
            # again under the name neither runs them nor takes their InferenceIds as its
            # own requests' (which would be answered with the old output locations).
            conn.execute(delete(t.async_requests).where(t.async_requests.c.endpoint == name))
            collect_kept(conn)
        if result.rowcount == 0:
            raise ResourceNotFound.of("endpoint", name)

    # -- shared ---------------------------------------------------------------------------

    def _get_endpoint(self, conn: Connection, name: str, *, lock: bool = False) -> Endpoint:
        query = select(t.endpoints).where(t.endpoints.c.name == name)
        if lock and conn.dialect.name == "postgresql":
            query = query.with_for_update()
        row = conn.execute(query).mappings().first()
        if row is None:
            raise ResourceNotFound.of("endpoint", name)
        return _endpoint(row)

    def _insert(self, table: Any, row: dict[str, Any], taken_message: str) -> None:
        try:
            with self._tx() as conn:
                if table is t.models or table is t.endpoint_configs:
                    _make_room(conn, table, row["name"])
                conn.execute(insert(table).values(**row))
        except IntegrityError as exc:
            raise AlreadyExists(taken_message) from exc

    def _retire(self, table: Any, name: str, kind: str) -> None:
        """Delete the model or config ``name``, as SageMaker lets users do while an
        endpoint runs it. That endpoint's instances are started again from it after a
        restart, scaled and updated from it: it is kept, marked deleted (no longer
        described, listed or named by a new resource), until no endpoint runs it."""
        with self._tx() as conn:
            query = select(table.c.name).where(table.c.name == name).where(_live(table))
            if conn.execute(query).first() is None:
                raise ResourceNotFound.of(kind, name)
            if name in _in_use(conn, table):
                conn.execute(update(table).where(table.c.name == name).values(deleted=True))
            else:
                conn.execute(delete(table).where(table.c.name == name))


_HIDDEN = "~"
"""The first character of a kept row's name once a new resource took its own: no name
SageMaker's patterns allow begins with it."""


def _live(table: Any) -> Any:
    return or_(table.c.deleted.is_(None), table.c.deleted.is_(False))


def _used_configs(conn: Connection) -> set[str]:
    rows = conn.execute(select(t.endpoints.c.config_name, t.endpoints.c.pending_config_name))
    return {name for row in rows for name in row if name}


def _used_models(conn: Connection) -> set[str]:
    """Models an endpoint's config (or pending config) names, or a component does."""
    table = t.endpoint_configs
    used: set[str] = set()
    query = select(table.c.variants).where(table.c.name.in_(_used_configs(conn)))
    for (variants,) in conn.execute(query):
        used.update(v.get("model_name") or "" for v in variants or ())
    components = t.inference_components
    for spec, served in conn.execute(select(components.c.spec, components.c.served)):
        used.add((spec or {}).get("model_name") or "")
        # What a failed update rolls back to (control/convergence.py _roll_back).
        used.add(((served or {}).get("spec") or {}).get("model_name") or "")
    used.discard("")
    return used


def _in_use(conn: Connection, table: Any) -> set[str]:
    return _used_configs(conn) if table is t.endpoint_configs else _used_models(conn)


def collect_kept(conn: Connection) -> None:
    """Models and configs kept for endpoints that no longer run them go (_retire)."""
    configs = t.endpoint_configs
    conn.execute(
        delete(configs)
        .where(configs.c.deleted.is_(True))
        .where(configs.c.name.not_in(_used_configs(conn)))
    )
    models = t.models
    conn.execute(
        delete(models)
        .where(models.c.deleted.is_(True))
        .where(models.c.name.not_in(_used_models(conn)))
    )


def _make_room(conn: Connection, table: Any, name: str) -> None:
    """A new model or config under the name of one kept for an endpoint (_retire): the
    kept one takes a hidden name, and what runs it follows, so the endpoint keeps
    running what it ran (as on SageMaker) and the name is the new resource's."""
    query = (
        select(table.c.name, table.c.raw)
        .where(func.lower(table.c.name) == name.lower())
        .where(table.c.deleted.is_(True))
    )
    found = conn.execute(query).first()
    if found is None:
        return
    old, hidden = str(found[0]), f"{_HIDDEN}{secrets.token_hex(8)}"
    # The name it was given stays in its request, which describes it (shown_config_name).
    key = "EndpointConfigName" if table is t.endpoint_configs else "ModelName"
    raw = {**(found[1] or {}), key: old}
    conn.execute(update(table).where(table.c.name == old).values(name=hidden, raw=raw))
    if table is t.endpoint_configs:
        for column in ("config_name", "pending_config_name"):
            where = t.endpoints.c[column] == old
            conn.execute(update(t.endpoints).where(where).values({column: hidden}))
        return
    configs = t.endpoint_configs
    used = select(configs.c.name, configs.c.variants).where(configs.c.name.in_(_used_configs(conn)))
    for config, variants in conn.execute(used).all():
        if any(v.get("model_name") == old for v in variants or ()):
            renamed = [{**v, "model_name": hidden} if v.get("model_name") == old else v
                       for v in variants]  # fmt: skip
            conn.execute(update(configs).where(configs.c.name == config).values(variants=renamed))
    components = t.inference_components
    rows = conn.execute(select(components.c.name, components.c.spec, components.c.served))
    for component, spec, served in rows.all():
        changes: dict[str, Any] = {}
        if (spec or {}).get("model_name") == old:
            changes["spec"] = {**spec, "model_name": hidden}
        if ((served or {}).get("spec") or {}).get("model_name") == old:
            changes["served"] = {**served, "spec": {**served["spec"], "model_name": hidden}}
        if changes:
            conn.execute(update(components).where(components.c.name == component).values(changes))


def _make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        if url in ("sqlite://", "sqlite:///:memory:"):
            engine = create_engine(
                url, connect_args={"check_same_thread": False}, poolclass=StaticPool
            )
        else:
            engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            # WAL lets the reconciler read while the control plane writes.
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
            # SQLAlchemy's recipe for SQLite transactions: we issue BEGIN ourselves.
            dbapi_conn.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # IMMEDIATE takes the write lock up front, so a transaction that reads then
            # writes (a quota count, a status check) can't be overtaken between the two,
            # and concurrent writers wait (busy timeout) instead of failing.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        serialize(engine)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _variant_json(v: VariantSpec) -> dict[str, Any]:
    return {
        "name": v.name,
        "model_name": v.model_name,
        "instance_type": v.instance_type,
        "instance_count": v.instance_count,
        "weight": v.weight,
        "routing_strategy": v.routing_strategy.value,
        "serverless": None
        if v.serverless is None
        else {
            "memory_mb": v.serverless.memory_mb,
            "max_concurrency": v.serverless.max_concurrency,
            "provisioned_concurrency": v.serverless.provisioned_concurrency,
        },
        "shadow": v.shadow,
        "managed_scaling": None if v.managed_scaling is None else list(v.managed_scaling),
    }


def _model(row: Any) -> Model:
    return Model(
        name=row["name"],
        arn=row["arn"],
        image=row["image"],
        model_data_url=row["model_data_url"],
        environment=dict(row["environment"] or {}),
        execution_role_arn=row["execution_role_arn"],
        created=_utc(row["created"]),
        raw=dict(row["raw"] or {}),
    )


def _endpoint_config(row: Any) -> EndpointConfig:
    variants = tuple(
        VariantSpec(
            name=v["name"],
            model_name=v["model_name"],
            instance_type=v["instance_type"],
            instance_count=int(v["instance_count"]),
            weight=float(v["weight"]),
            routing_strategy=RoutingStrategy(v["routing_strategy"]),
            serverless=ServerlessConfig(**v["serverless"]) if v.get("serverless") else None,
            shadow=bool(v.get("shadow", False)),
            managed_scaling=None
            if not v.get("managed_scaling")
            else (int(v["managed_scaling"][0]), int(v["managed_scaling"][1])),
        )
        for v in row["variants"]
    )
    cfg = row["async_config"]
    return EndpointConfig(
        name=row["name"],
        arn=row["arn"],
        variants=variants,
        created=_utc(row["created"]),
        raw=dict(row["raw"] or {}),
        async_config=None
        if cfg is None
        else AsyncConfig(
            output_path=cfg["output_path"],
            failure_path=cfg["failure_path"],
            success_topic=cfg.get("success_topic"),
            error_topic=cfg.get("error_topic"),
            include_response_in=tuple(cfg.get("include_response_in", ())),
            max_concurrent_per_instance=int(cfg.get("max_concurrent_per_instance", 1)),
        ),
    )


def _async_json(cfg: AsyncConfig | None) -> dict[str, Any] | None:
    if cfg is None:
        return None
    return {
        "output_path": cfg.output_path,
        "failure_path": cfg.failure_path,
        "success_topic": cfg.success_topic,
        "error_topic": cfg.error_topic,
        "include_response_in": list(cfg.include_response_in),
        "max_concurrent_per_instance": cfg.max_concurrent_per_instance,
    }


def _endpoint(row: Any) -> Endpoint:
    return Endpoint(
        name=row["name"],
        arn=row["arn"],
        config_name=row["config_name"],
        pending_config_name=row["pending_config_name"],
        status=EndpointStatus(row["status"]),
        failure_reason=row["failure_reason"],
        created=_utc(row["created"]),
        modified=_utc(row["modified"]),
        variants=tuple(
            VariantState(
                name=v["name"],
                desired_weight=float(v["desired_weight"]),
                desired_instance_count=int(v["desired_instance_count"]),
                shadow=bool(v.get("shadow", False)),
            )
            for v in row["variants"]
        ),
        generation=int(row["generation"]),
        deployment=row["deployment"],
        last_deployment=row["last_deployment"],
        retained=row["retained"],
    )


def _endpoint_row(e: Endpoint) -> dict[str, Any]:
    return {
        "name": e.name,
        "arn": e.arn,
        "config_name": e.config_name,
        "pending_config_name": e.pending_config_name,
        "status": e.status.value,
        "failure_reason": e.failure_reason,
        "created": e.created,
        "modified": e.modified,
        "variants": [
            {
                "name": v.name,
                "desired_weight": v.desired_weight,
                "desired_instance_count": v.desired_instance_count,
                "shadow": v.shadow,
            }
            for v in e.variants
        ],
        "generation": e.generation,
        "deployment": e.deployment,
        "last_deployment": e.last_deployment,
        "retained": e.retained,
    }
