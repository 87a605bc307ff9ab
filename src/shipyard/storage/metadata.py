"""MetadataStore: typed methods over SQLAlchemy that return records, never rows.

Synchronous on purpose: control-plane calls are rare and short, and the gateway runs
them in a worker thread, so the data path never waits on the store.
"""

from __future__ import annotations

import logging
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

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = _make_engine(url)

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

    def get_model(self, name: str) -> Model:
        with self._tx() as conn:
            row = conn.execute(select(t.models).where(t.models.c.name == name)).mappings().first()
        if row is None:
            raise ResourceNotFound.of("model", name)
        return _model(row)

    def list_models(self) -> list[Model]:
        with self._tx() as conn:
            rows = conn.execute(select(t.models)).mappings().all()
        return [_model(r) for r in rows]

    def delete_model(self, name: str) -> None:
        self._delete(t.models, name, "model")

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

    def get_endpoint_config(self, name: str) -> EndpointConfig:
        table = t.endpoint_configs
        with self._tx() as conn:
            row = conn.execute(select(table).where(table.c.name == name)).mappings().first()
        if row is None:
            raise ResourceNotFound.of("endpoint configuration", name)
        return _endpoint_config(row)

    def list_endpoint_configs(self) -> list[EndpointConfig]:
        with self._tx() as conn:
            rows = conn.execute(select(t.endpoint_configs)).mappings().all()
        return [_endpoint_config(r) for r in rows]

    def delete_endpoint_config(self, name: str) -> None:
        self._delete(t.endpoint_configs, name, "endpoint configuration")

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
            for event in events:
                record_event(conn, event)

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
            changed = replace(current, modified=now(), **changes)
            if "generation" not in changes:
                changed = replace(changed, generation=current.generation + 1)
            conn.execute(
                update(t.endpoints)
                .where(t.endpoints.c.name == name)
                .values(**_endpoint_row(changed))
            )
            if also is not None:
                also(conn)
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
                conn.execute(insert(table).values(**row))
        except IntegrityError as exc:
            raise AlreadyExists(taken_message) from exc

    def _delete(self, table: Any, name: str, kind: str) -> None:
        with self._tx() as conn:
            result = conn.execute(delete(table).where(table.c.name == name))
        if result.rowcount == 0:
            raise ResourceNotFound.of(kind, name)


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
