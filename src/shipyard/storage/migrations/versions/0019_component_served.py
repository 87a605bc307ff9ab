"""inference components: the last specification that served, which a failed update
rolls back to

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inference_components") as batch:
        batch.add_column(sa.Column("served", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("inference_components") as batch:
        batch.drop_column("served")
