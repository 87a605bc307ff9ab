"""autoscaling: scalable targets, scaling policies and scaling activities

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scalable_targets",
        sa.Column("resource_id", sa.String(1600), primary_key=True),
        sa.Column("arn", sa.String(1600), nullable=False),
        sa.Column("min_capacity", sa.Integer, nullable=False),
        sa.Column("max_capacity", sa.Integer, nullable=False),
        sa.Column("role_arn", sa.String(1600), nullable=False),
        sa.Column("suspended", sa.JSON, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "scaling_policies",
        sa.Column("resource_id", sa.String(1600), primary_key=True),
        sa.Column("name", sa.String(256), primary_key=True),
        sa.Column("arn", sa.String(1600), nullable=False),
        sa.Column("policy_type", sa.String(64), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "scaling_activities",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("activity_id", sa.String(64), nullable=False, unique=True),
        sa.Column("resource_id", sa.String(1600), nullable=False, index=True),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("cause", sa.Text, nullable=False),
        sa.Column("started", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended", sa.DateTime(timezone=True)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_message", sa.Text),
        sa.Column("from_count", sa.Integer, nullable=False),
        sa.Column("to_count", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scaling_activities")
    op.drop_table("scaling_policies")
    op.drop_table("scalable_targets")
