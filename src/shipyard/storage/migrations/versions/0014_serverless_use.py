"""serverless use: what gateways not holding a serverless endpoint need of its instances

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "serverless_use",
        sa.Column("endpoint", sa.String(63), primary_key=True),
        sa.Column("variant", sa.String(63), primary_key=True),
        sa.Column("gateway", sa.String(64), primary_key=True),
        sa.Column("wanted", sa.Integer, nullable=False),
        sa.Column("uses", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("serverless_use")
