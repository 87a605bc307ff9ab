"""serverless use: the requests each gateway has admitted, for MaxConcurrency in all

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("serverless_use") as batch:
        batch.add_column(sa.Column("active", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("serverless_use") as batch:
        batch.drop_column("active")
