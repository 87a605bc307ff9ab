"""deployments: an update's DeploymentConfig under way, and the last one given

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.add_column(sa.Column("deployment", sa.JSON))
        batch.add_column(sa.Column("last_deployment", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("last_deployment")
        batch.drop_column("deployment")
