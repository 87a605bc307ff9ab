"""serverless use: the instances each gateway used, and the holder's failed cold starts

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("serverless_use") as batch:
        batch.add_column(sa.Column("failed_uses", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("failure", sa.Text))
        batch.add_column(sa.Column("used", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("serverless_use") as batch:
        batch.drop_column("used")
        batch.drop_column("failure")
        batch.drop_column("failed_uses")
