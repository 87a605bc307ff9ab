"""``shared_secret(engine, name)``: a key every gateway of one store uses alike.

The first gateway to ask makes it (32 random bytes) and records it; every other one, now
or later, reads the same. Two asking at once both insert-if-absent and then read the row
that won, so they agree. The store holds it in the clear: what it signs (session ids,
routing/sessions.py) is routing, and whoever reads the store can already reach every
instance it routes to.
"""

from __future__ import annotations

import secrets

from sqlalchemy import Engine, select

from shipyard.storage import tables as t
from shipyard.storage.transactions import insert_new, transaction

_S = t.shared_secrets


def shared_secret(engine: Engine, name: str) -> bytes:
    """The store's key ``name``, made on first use."""
    with transaction(engine) as conn:
        made = {"name": name, "value": secrets.token_bytes(32).hex()}
        insert_new(conn, _S, made, ["name"])
        value = conn.execute(select(_S.c.value).where(_S.c.name == name)).scalar_one()
    return bytes.fromhex(value)
