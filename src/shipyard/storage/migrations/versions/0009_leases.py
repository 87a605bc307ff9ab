"""leases: one holder at a time per fleet, and the routes the holder records

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("holder", sa.String(64)),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("term", sa.Integer, nullable=False),
        sa.Column("routes", sa.JSON),
    )


def downgrade() -> None:
    op.drop_table("leases")
