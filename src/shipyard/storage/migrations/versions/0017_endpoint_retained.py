"""endpoints: the variant properties an update in progress keeps (RetainAllVariantProperties)

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.add_column(sa.Column("retained", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("retained")
