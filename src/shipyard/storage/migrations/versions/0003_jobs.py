"""long-running jobs

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
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
        sa.Column("pid", sa.Integer),
        sa.Column("applied_lines", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("jobs")
