"""names unique whatever their case, as SageMaker's are (its ARNs are lower-case)

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

TABLES = (
    "models",
    "endpoint_configs",
    "endpoints",
    "inference_components",
    "jobs",
    "transform_jobs",
)

log = logging.getLogger(__name__)


def upgrade() -> None:
    conn = op.get_bind()
    for table in TABLES:
        clash = conn.execute(
            sa.text(f"SELECT lower(name) FROM {table} GROUP BY lower(name) HAVING count(*) > 1")
        ).first()
        if clash is not None:
            # Made before names were compared this way: both stay, and this table's
            # names are compared as they are spelt from now on (its unique index can
            # only be made while no two differ only in case; none is made later).
            log.warning("%s: names %r differ only in case; left unindexed", table, clash[0])
            continue
        op.create_index(f"ix_{table}_name_lower", table, [sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"ix_{table}_name_lower", table, if_exists=True)
