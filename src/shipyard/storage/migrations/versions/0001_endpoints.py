"""models, endpoint configs and endpoints

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("image", sa.Text, nullable=False),
        sa.Column("model_data_url", sa.Text),
        sa.Column("environment", sa.JSON, nullable=False),
        sa.Column("execution_role_arn", sa.String(2048)),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("raw", sa.JSON, nullable=False),
    )
    op.create_table(
        "endpoint_configs",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("variants", sa.JSON, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("raw", sa.JSON, nullable=False),
    )
    op.create_table(
        "endpoints",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("config_name", sa.String(63), nullable=False),
        sa.Column("pending_config_name", sa.String(63)),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("failure_reason", sa.Text),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=False),
        sa.Column("variants", sa.JSON, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("endpoints")
    op.drop_table("endpoint_configs")
    op.drop_table("models")
