"""CloudWatch: metric series and their datapoints, alarms and their history

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_series",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(64), nullable=False, unique=True),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("dimensions", sa.JSON, nullable=False),
        sa.Column("unit", sa.String(32)),
        sa.Column("last_seen", sa.BigInteger, nullable=False, index=True),
    )
    op.create_table(
        "metric_points",
        sa.Column("series", sa.Integer, primary_key=True),
        sa.Column("period", sa.Integer, primary_key=True),
        sa.Column("start", sa.BigInteger, primary_key=True),
        sa.Column("source", sa.String(64), primary_key=True),
        sa.Column("count", sa.Float, nullable=False),
        sa.Column("sum", sa.Float, nullable=False),
        sa.Column("min", sa.Float, nullable=False),
        sa.Column("max", sa.Float, nullable=False),
        sa.Column("hist", sa.JSON),
    )
    op.create_table(
        "alarms",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("arn", sa.String(1600), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("reason_data", sa.Text),
        sa.Column("state_updated", sa.DateTime(timezone=True), nullable=False),
        sa.Column("config_updated", sa.DateTime(timezone=True), nullable=False),
        sa.Column("evaluated", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "alarm_history",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("alarm", sa.String(255), nullable=False, index=True),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False, index=True),
        sa.Column("item_type", sa.String(32), nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("alarm_history", "alarms", "metric_points", "metric_series"):
        op.drop_table(table)
