"""asynchronous inference: the request queue, and async configs of endpoint configs

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("endpoint_configs") as batch:
        batch.add_column(sa.Column("async_config", sa.JSON))
    op.create_table(
        "async_requests",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("endpoint", sa.String(63), nullable=False),
        sa.Column("inference_id", sa.String(64), nullable=False),
        sa.Column("input_location", sa.Text, nullable=False),
        sa.Column("output_location", sa.Text, nullable=False),
        sa.Column("failure_location", sa.Text, nullable=False),
        sa.Column("received", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires", sa.DateTime(timezone=True), nullable=False),
        sa.Column("invocation_timeout_s", sa.Float, nullable=False),
        sa.Column("content_type", sa.Text),
        sa.Column("accept", sa.Text),
        sa.Column("custom_attributes", sa.Text),
        sa.Column("notify", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("owner", sa.String(64)),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("started", sa.DateTime(timezone=True)),
        sa.Column("finished", sa.DateTime(timezone=True)),
        sa.Column("failure_reason", sa.Text),
        sa.UniqueConstraint("endpoint", "inference_id", name="uq_async_requests_inference_id"),
    )
    op.create_index("ix_async_requests_queue", "async_requests", ["endpoint", "status", "id"])


def downgrade() -> None:
    op.drop_table("async_requests")
    with op.batch_alter_table("endpoint_configs") as batch:
        batch.drop_column("async_config")
