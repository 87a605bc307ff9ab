"""CloudWatch: the key that created a metric series or an alarm, for per-key quotas

Series put before owners were kept count as callers' (owner ""), the gateway's own
(in the AWS/ and /aws/ namespaces) as none.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("metric_series", "alarms"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("owner", sa.String(128)))
            batch.create_index(f"ix_{table}_owner", ["owner"])
    series = sa.table("metric_series", sa.column("namespace", sa.String), sa.column("owner"))
    namespace = sa.func.lower(series.c.namespace)
    op.execute(
        series.update()
        .where(~namespace.startswith("aws/"), ~namespace.startswith("/aws/"))
        .values(owner="")
    )


def downgrade() -> None:
    for table in ("metric_series", "alarms"):
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f"ix_{table}_owner")
            batch.drop_column("owner")
