"""processing jobs, and Model Monitor's job definitions, schedules and executions

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_NAMED = ("processing_jobs", "monitoring_job_definitions", "monitoring_schedules")


def upgrade() -> None:
    op.create_table(
        "processing_jobs",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("job_type", sa.String(256)),
        sa.Column("status", sa.String(32), nullable=False, index=True),
        sa.Column("secondary_status", sa.String(32), nullable=False),
        sa.Column("failure_reason", sa.Text),
        sa.Column("model_artifacts", sa.Text),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("transitions", sa.JSON, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started", sa.DateTime(timezone=True)),
        sa.Column("ended", sa.DateTime(timezone=True)),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("runner", sa.String(1024)),
        sa.Column("applied_lines", sa.Integer, nullable=False),
    )
    op.create_table(
        "monitoring_job_definitions",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "monitoring_schedules",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("failure_reason", sa.Text),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_tick", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "monitoring_executions",
        sa.Column("job_name", sa.String(63), primary_key=True),
        sa.Column("schedule", sa.String(63), nullable=False, index=True),
        sa.Column("scheduled", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("failure_reason", sa.Text),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.UniqueConstraint("schedule", "scheduled"),
    )
    for table in _NAMED:
        op.create_index(f"ix_{table}_name_lower", table, [sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    for table in _NAMED:
        op.drop_index(f"ix_{table}_name_lower", table)
    for table in (*_NAMED, "monitoring_executions"):
        op.drop_table(table)
