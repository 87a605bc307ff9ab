"""models and endpoint configs: one deleted while an endpoint still runs it is kept,
marked deleted, until no endpoint does

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("models", "endpoint_configs"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("deleted", sa.Boolean))


def downgrade() -> None:
    for table in ("models", "endpoint_configs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("deleted")
