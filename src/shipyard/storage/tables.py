"""Every table of the metadata store, in one place. Alembic revisions mirror this file."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
)

metadata = MetaData()

models = Table(
    "models",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("image", Text, nullable=False),
    Column("model_data_url", Text),
    Column("environment", JSON, nullable=False),
    Column("execution_role_arn", String(2048)),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("raw", JSON, nullable=False),
    Column("deleted", Boolean),
)

endpoint_configs = Table(
    "endpoint_configs",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("variants", JSON, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("raw", JSON, nullable=False),
    Column("async_config", JSON),
    Column("deleted", Boolean),
)

inference_components = Table(
    "inference_components",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("endpoint", String(63), nullable=False, index=True),
    Column("variant", String(63), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("raw", JSON, nullable=False),
    Column("copies", Integer, nullable=False),
    Column("status", String(32), nullable=False),
    Column("failure_reason", Text),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("generation", Integer, nullable=False, default=0),
    Column("served", JSON),
)

endpoints = Table(
    "endpoints",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("config_name", String(63), nullable=False),
    Column("pending_config_name", String(63)),
    Column("status", String(32), nullable=False),
    Column("failure_reason", Text),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("variants", JSON, nullable=False),
    Column("generation", Integer, nullable=False, default=0),
    Column("deployment", JSON),
    Column("last_deployment", JSON),
    Column("retained", JSON),
)

jobs = Table(
    "jobs",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("job_type", String(256)),
    Column("status", String(32), nullable=False, index=True),
    Column("secondary_status", String(32), nullable=False),
    Column("failure_reason", Text),
    Column("model_artifacts", Text),
    Column("request", JSON, nullable=False),
    Column("transitions", JSON, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("started", DateTime(timezone=True)),
    Column("ended", DateTime(timezone=True)),
    Column("attempt", Integer, nullable=False),
    Column("runner", String(1024)),
    Column("applied_lines", Integer, nullable=False),
)

processing_jobs = Table(
    "processing_jobs",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("job_type", String(256)),
    Column("status", String(32), nullable=False, index=True),
    Column("secondary_status", String(32), nullable=False),
    Column("failure_reason", Text),
    Column("model_artifacts", Text),
    Column("request", JSON, nullable=False),
    Column("transitions", JSON, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("started", DateTime(timezone=True)),
    Column("ended", DateTime(timezone=True)),
    Column("attempt", Integer, nullable=False),
    Column("runner", String(1024)),
    Column("applied_lines", Integer, nullable=False),
)
"""Processing jobs: the columns of ``jobs`` (JobStore serves both); ``model_artifacts``
holds a processing job's ExitMessage."""

monitoring_job_definitions = Table(
    "monitoring_job_definitions",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("request", JSON, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
)

monitoring_schedules = Table(
    "monitoring_schedules",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("request", JSON, nullable=False),
    Column("status", String(32), nullable=False),
    Column("failure_reason", Text),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("next_tick", DateTime(timezone=True)),
)

monitoring_executions = Table(
    "monitoring_executions",
    metadata,
    Column("job_name", String(63), primary_key=True),
    Column("schedule", String(63), nullable=False, index=True),
    Column("scheduled", DateTime(timezone=True), nullable=False),
    Column("status", String(32), nullable=False),
    Column("failure_reason", Text),
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("window_end", DateTime(timezone=True), nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("detail", JSON, nullable=False),
    UniqueConstraint("schedule", "scheduled"),
)

events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(512), nullable=False, unique=True),
    Column("detail_type", String(256), nullable=False),
    Column("source", String(256), nullable=False),
    Column("resource", String(2048), nullable=False),
    Column("detail", JSON, nullable=False),
    Column("topics", JSON, nullable=False),
    Column("subject", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, index=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("claimed_until", DateTime(timezone=True)),
    Column("dispatched_at", DateTime(timezone=True), index=True),
)

deliveries = Table(
    "deliveries",
    metadata,
    Column("event_key", String(512), primary_key=True),
    Column("subscriber", String(80), primary_key=True),
    Column("target", Text, nullable=False),
    Column("topic", String(256), nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("last_error", Text),
    Column("updated", DateTime(timezone=True), nullable=False),
)

async_requests = Table(
    "async_requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("endpoint", String(63), nullable=False),
    Column("inference_id", String(64), nullable=False),
    Column("input_location", Text),  # None: the input is ``body``
    Column("output_location", Text, nullable=False),
    Column("failure_location", Text, nullable=False),
    Column("received", DateTime(timezone=True), nullable=False),
    Column("expires", DateTime(timezone=True), nullable=False),
    Column("invocation_timeout_s", Float, nullable=False),
    Column("content_type", Text),
    Column("accept", Text),
    Column("custom_attributes", Text),
    Column("notify", JSON, nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("owner", String(64)),
    Column("lease_until", DateTime(timezone=True)),
    Column("started", DateTime(timezone=True)),
    Column("finished", DateTime(timezone=True)),
    Column("failure_reason", Text),
    Column("body", LargeBinary),  # an inline input, at most 128,000 bytes
    UniqueConstraint("endpoint", "inference_id", name="uq_async_requests_inference_id"),
    Index("ix_async_requests_queue", "endpoint", "status", "id"),
)

tags = Table(
    "tags",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("key", String(128), primary_key=True),
    Column("value", String(256), nullable=False),
)

scalable_targets = Table(
    "scalable_targets",
    metadata,
    Column("resource_id", String(1600), primary_key=True),
    Column("arn", String(1600), nullable=False),
    Column("min_capacity", Integer, nullable=False),
    Column("max_capacity", Integer, nullable=False),
    Column("role_arn", String(1600), nullable=False),
    Column("suspended", JSON, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
)

scaling_policies = Table(
    "scaling_policies",
    metadata,
    Column("resource_id", String(1600), primary_key=True),
    Column("name", String(256), primary_key=True),
    Column("arn", String(1600), nullable=False),
    Column("policy_type", String(64), nullable=False),
    Column("config", JSON, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
)

scaling_activities = Table(
    "scaling_activities",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("activity_id", String(64), nullable=False, unique=True),
    Column("resource_id", String(1600), nullable=False, index=True),
    Column("description", Text, nullable=False),
    Column("cause", Text, nullable=False),
    Column("started", DateTime(timezone=True), nullable=False),
    Column("ended", DateTime(timezone=True)),
    Column("status", String(16), nullable=False),
    Column("status_message", Text),
    Column("from_count", Integer, nullable=False),
    Column("to_count", Integer, nullable=False),
)

transform_jobs = Table(
    "transform_jobs",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("status", String(32), nullable=False, index=True),
    Column("request", JSON, nullable=False),
    Column("failure_reason", Text),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("started", DateTime(timezone=True)),
    Column("ended", DateTime(timezone=True)),
    Column("objects_total", Integer),
)

transform_objects = Table(
    "transform_objects",
    metadata,
    Column("job", String(63), primary_key=True),
    Column("key", String(1024), primary_key=True),
    Column("records", Integer, nullable=False),
    Column("finished", DateTime(timezone=True), nullable=False),
)

leases = Table(
    "leases",
    metadata,
    Column("kind", String(32), primary_key=True),
    Column("name", String(63), primary_key=True),
    Column("holder", String(64)),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("term", Integer, nullable=False),
    Column("routes", JSON),
)

serverless_use = Table(
    "serverless_use",
    metadata,
    Column("endpoint", String(63), primary_key=True),
    Column("variant", String(63), primary_key=True),
    Column("gateway", String(64), primary_key=True),
    Column("wanted", Integer, nullable=False),
    Column("uses", Integer, nullable=False),
    Column("failed_uses", Integer, nullable=False, server_default="0"),
    Column("failure", Text),
    Column("used", JSON),
    Column("active", Integer, nullable=False, server_default="0"),
)

metric_series = Table(
    "metric_series",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # sha256 of the namespace, name and dimensions (longer than an index may take).
    Column("key", String(64), nullable=False, unique=True),
    Column("namespace", String(255), nullable=False),
    Column("name", String(255), nullable=False),
    Column("dimensions", JSON, nullable=False),
    Column("unit", String(32)),
    Column("last_seen", BigInteger, nullable=False, index=True),
    # Who created it with PutMetricData: the key's id, "" with no ``auth:``; None for the
    # gateway's own recorded series (which no quota counts).
    Column("owner", String(128), index=True),
)

metric_points = Table(
    "metric_points",
    metadata,
    Column("series", Integer, primary_key=True),
    Column("period", Integer, primary_key=True),
    Column("start", BigInteger, primary_key=True),
    # The gateway that recorded it (``put`` for PutMetricData): gateways sharing the
    # store never write the same row, and a read adds their rows up.
    Column("source", String(64), primary_key=True),
    Column("count", Float, nullable=False),
    Column("sum", Float, nullable=False),
    Column("min", Float, nullable=False),
    Column("max", Float, nullable=False),
    Column("hist", JSON),
)

alarms = Table(
    "alarms",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("arn", String(1600), nullable=False),
    Column("config", JSON, nullable=False),
    Column("state", String(32), nullable=False),
    Column("reason", Text, nullable=False),
    Column("reason_data", Text),
    Column("state_updated", DateTime(timezone=True), nullable=False),
    Column("config_updated", DateTime(timezone=True), nullable=False),
    Column("evaluated", DateTime(timezone=True)),
    # The key that created it ("" with no ``auth:``, None from the stack file or before
    # owners were kept): each key's alarms are bounded.
    Column("owner", String(128), index=True),
)

alarm_history = Table(
    "alarm_history",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("alarm", String(255), nullable=False, index=True),
    Column("time", DateTime(timezone=True), nullable=False, index=True),
    Column("item_type", String(32), nullable=False),
    Column("summary", Text, nullable=False),
    Column("data", Text, nullable=False),
)

shared_secrets = Table(
    "shared_secrets",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("value", String(128), nullable=False),
)
"""Keys every gateway of one store uses alike (storage/secrets.py): made by the first to
ask, read by the others."""

closed_sessions = Table(
    "closed_sessions",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("session_id", String(128), nullable=False, index=True),
    Column("expires", Float, nullable=False, index=True),
    # Never a seq used before, even once the table was emptied: readers go by it.
    sqlite_autoincrement=True,
)
"""Sessions their models closed, until they would have expired (storage/sessions.py): so
every gateway of the store refuses them."""

session_pins = Table(
    "session_pins",
    metadata,
    Column("session_key", String(64), primary_key=True),
    Column("instance", String(16), nullable=False),
    Column("expires", Float, nullable=False, index=True),
)
"""Sessions opened under a model's own id: the instance holding each (its digest), until
it expires or closes (storage/sessions.py), for every gateway of the store to route."""

# Names are unique whatever their case, as SageMaker's are (migration 0016).
for _table in (
    models,
    endpoint_configs,
    endpoints,
    inference_components,
    jobs,
    transform_jobs,
    processing_jobs,
    monitoring_job_definitions,
    monitoring_schedules,
):
    Index(f"ix_{_table.name}_name_lower", func.lower(_table.c.name), unique=True)
