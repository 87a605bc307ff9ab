"""async_requests: an input sent inline (InvokeEndpointAsync's Body) is kept with its
request, which then has no input location

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("async_requests") as batch:
        batch.add_column(sa.Column("body", sa.LargeBinary))
        batch.alter_column("input_location", existing_type=sa.Text, nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM async_requests WHERE input_location IS NULL")
    with op.batch_alter_table("async_requests") as batch:
        batch.alter_column("input_location", existing_type=sa.Text, nullable=False)
        batch.drop_column("body")
