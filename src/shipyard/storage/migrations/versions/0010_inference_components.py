"""inference components: models hosted on an endpoint's instances, each in copies

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inference_components",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("arn", sa.String(256), nullable=False),
        sa.Column("endpoint", sa.String(63), nullable=False, index=True),
        sa.Column("variant", sa.String(63), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("raw", sa.JSON, nullable=False),
        sa.Column("copies", sa.Integer, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("failure_reason", sa.Text),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("inference_components")
