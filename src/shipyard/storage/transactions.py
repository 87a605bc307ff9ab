"""``transaction(engine)``: the one way the stores open a transaction.

On SQLite, threads of one process first queue on a lock of their own. SQLite makes a
writer that finds the database locked sleep and poll (up to 100 ms a turn), and every
transaction here takes the write lock up front (BEGIN IMMEDIATE), so under load, with
the control plane, the job supervisor, the event dispatcher and the async consumer all
writing from worker threads, those sleeps would cost far more than the transactions.
A lock hands the turn over at once. Between processes SQLite's busy timeout still
applies; PostgreSQL needs none of this.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite

_locks: weakref.WeakKeyDictionary[Engine, threading.RLock] = weakref.WeakKeyDictionary()


def serialize(engine: Engine) -> None:
    """Make this process's transactions on ``engine`` take turns (SQLite)."""
    _locks[engine] = threading.RLock()


@contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    lock = _locks.get(engine)
    if lock is None:
        with engine.begin() as conn:
            yield conn
        return
    with lock, engine.begin() as conn:
        yield conn


def upsert(dialect: str, table: Table) -> Any:
    """An INSERT into ``table`` that takes ``on_conflict_do_nothing`` and
    ``on_conflict_do_update``: the one of ``dialect``, SQLite's or PostgreSQL's."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


def insert_new(conn: Connection, table: Table, row: dict[str, Any], keys: Sequence[str]) -> bool:
    """Insert ``row`` unless its unique ``keys`` exist; never raises on a duplicate. True
    when it was inserted."""
    statement = upsert(conn.dialect.name, table).values(**row)
    statement = statement.on_conflict_do_nothing(index_elements=list(keys))
    # RETURNING, not rowcount: with implicit RETURNING psycopg reports rowcount -1.
    returning = statement.returning(*(table.c[k] for k in keys))
    return conn.execute(returning).first() is not None
