"""transform jobs and the input objects each has finished

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "transform_jobs",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("status", sa.String(32), nullable=False, index=True),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("failure_reason", sa.Text),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started", sa.DateTime(timezone=True)),
        sa.Column("ended", sa.DateTime(timezone=True)),
        sa.Column("objects_total", sa.Integer),
    )
    op.create_table(
        "transform_objects",
        sa.Column("job", sa.String(63), primary_key=True),
        sa.Column("key", sa.String(1024), primary_key=True),
        sa.Column("records", sa.Integer, nullable=False),
        sa.Column("finished", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("transform_objects")
    op.drop_table("transform_jobs")
