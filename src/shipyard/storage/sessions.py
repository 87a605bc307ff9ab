"""Sessions closed by their models, shared by every gateway of one store.

A gateway records the closes its models answered (``record``) and reads the others'
(``since``: rows after the last it read), in a background loop (routing/session_closes.py):
never on the data path. A row is kept until the session would have expired, then
``purge`` drops it: an id past its expiry is refused anyway.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine, delete, func, insert, select

from shipyard.storage import tables as t
from shipyard.storage.transactions import transaction

_C = t.closed_sessions
_OVERLAP = 1000
"""Seqs read again on each read (``since``): a row committed late is found while fewer
rows than this were committed after it, each writer writing ``_BATCH`` at a time."""
_BATCH = 100


class ClosedSessions:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"ClosedSessions({self.engine.url.render_as_string(hide_password=True)!r})"

    def record(self, closes: Iterable[tuple[str, float]]) -> None:
        """Sessions closed: (id, the Unix time it would have expired). In transactions of
        at most ``_BATCH`` rows, so that no reader's overlap is outrun by one."""
        rows = [{"session_id": sid, "expires": expires} for sid, expires in closes]
        for start in range(0, len(rows), _BATCH):
            with transaction(self.engine) as conn:
                conn.execute(insert(_C), rows[start : start + _BATCH])

    def since(self, seq: int, now: float) -> tuple[list[tuple[str, float]], int]:
        """Closes recorded after ``seq`` (and the ``_OVERLAP`` before it) not yet expired
        at ``now``, and the store's last seq (0 when it holds none), to read after next.

        The overlap: on PostgreSQL a row may commit after a later one did, so a reader that
        saw the later one reads back far enough to find it (reading one twice does no harm).
        SQLite writes one transaction at a time, and never reuses a seq
        (``sqlite_autoincrement``).
        """
        with transaction(self.engine) as conn:
            last = conn.execute(select(func.max(_C.c.seq))).scalar_one_or_none() or 0
            if last < seq:
                seq = 0  # a store other than the one read before (restored, say): all of it
            rows = conn.execute(
                select(_C.c.session_id, _C.c.expires).where(
                    _C.c.seq > seq - _OVERLAP, _C.c.seq <= last, _C.c.expires > now
                )
            ).all()
        return [(sid, float(expires)) for sid, expires in rows], last

    def purge(self, now: float) -> int:
        """Drop the rows of sessions expired at ``now``; how many."""
        with transaction(self.engine) as conn:
            return conn.execute(delete(_C).where(_C.c.expires <= now)).rowcount or 0
