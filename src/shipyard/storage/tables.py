"""Every table of the metadata store, in one place. Alembic revisions mirror this file."""

from __future__ import annotations

from sqlalchemy import JSON, Column, DateTime, Integer, MetaData, String, Table, Text

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
)

endpoint_configs = Table(
    "endpoint_configs",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("arn", String(256), nullable=False),
    Column("variants", JSON, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("raw", JSON, nullable=False),
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
)
