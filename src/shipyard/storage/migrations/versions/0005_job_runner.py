"""jobs: the runner is a backend's handle (a string), not a PID

Revision ID: 0005
Revises: 0004

A job running when the gateway was upgraded has no handle yet; the supervisor adopts its
runner from the job's folder (JobBackend.find_job), so nothing is lost with the PID.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("runner", sa.String(1024)))
        batch.drop_column("pid")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pid", sa.Integer))
        batch.drop_column("runner")
