"""sessions under a model's own id: the instance holding each, for every gateway; closes
found by key

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_pins",
        sa.Column("session_key", sa.String(64), primary_key=True),
        sa.Column("instance", sa.String(16), nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
    )
    op.create_index("ix_session_pins_expires", "session_pins", ["expires"])
    op.create_index("ix_closed_sessions_session_id", "closed_sessions", ["session_id"])


def downgrade() -> None:
    op.drop_index("ix_closed_sessions_session_id", "closed_sessions")
    op.drop_index("ix_session_pins_expires", "session_pins")
    op.drop_table("session_pins")
