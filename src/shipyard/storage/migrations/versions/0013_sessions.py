"""sessions across gateways: the key their ids are signed with, and the sessions closed

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shared_secrets",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("value", sa.String(128), nullable=False),
    )
    op.create_table(
        "closed_sessions",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_closed_sessions_expires", "closed_sessions", ["expires"])


def downgrade() -> None:
    op.drop_index("ix_closed_sessions_expires", "closed_sessions")
    op.drop_table("closed_sessions")
    op.drop_table("shared_secrets")
