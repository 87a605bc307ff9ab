"""Sessions shared by every gateway of one store: those opened under a model's own id
(where each lives), and those closed by their models.

A gateway records a session opened under a model's own id before its client has the id
(``SessionPins.record``), and another that does not know an id reads it once
(``SessionPins.find``): only for a request naming an id the gateway does not know. It
records the closes its models answered (``ClosedSessions.record``) and reads the
others' (``since``: rows after the last it read), in a background loop
(routing/session_closes.py): never on the data path. Sessions are named by their key
(routing/sessions.py's ``key``: endpoint and id). A row is kept until the session would
have expired (a pin, until it closes), then ``purge`` drops it: an id past its expiry is
refused anyway.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine, delete, func, insert, or_, select

from shipyard.storage import tables as t
from shipyard.storage.transactions import insert_new, transaction

_C = t.closed_sessions
_P = t.session_pins
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
            batch = rows[start : start + _BATCH]
            with transaction(self.engine) as conn:
                conn.execute(insert(_C), batch)
                closed = [row["session_id"] for row in batch]
                conn.execute(delete(_P).where(_P.c.session_key.in_(closed)))

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
        """Drop the rows (closes and pins) of sessions expired at ``now``; how many."""
        with transaction(self.engine) as conn:
            pins = conn.execute(delete(_P).where(_P.c.expires <= now)).rowcount or 0
            return pins + (conn.execute(delete(_C).where(_C.c.expires <= now)).rowcount or 0)


class SessionPins:
    """Where sessions opened under a model's own id live, by key."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"SessionPins({self.engine.url.render_as_string(hide_password=True)!r})"

    def record(self, key: str, instance: bytes, expires: float, now: float) -> bool:
        """Session ``key`` lives on the instance of digest ``instance`` until ``expires``;
        False, and nothing changed, when the store has it open at ``now`` on another
        instance (a model cannot take another's session). One the same instance opens
        again, or one expired, is replaced (a model may reuse its ids)."""
        held = instance.hex()
        with transaction(self.engine) as conn:
            # Only a row this call may replace goes: a live one of another instance stays,
            # and the insert then does nothing (also when another gateway's, at once, won).
            replaceable = or_(_P.c.instance == held, _P.c.expires <= now)
            conn.execute(delete(_P).where(_P.c.session_key == key, replaceable))
            row = {"session_key": key, "instance": held, "expires": expires}
            return insert_new(conn, _P, row, ["session_key"])

    def find(self, key: str, now: float) -> tuple[bytes, float] | None:
        """(instance digest, expiry) of session ``key``, open at ``now``; None otherwise."""
        with transaction(self.engine) as conn:
            row = conn.execute(
                select(_P.c.instance, _P.c.expires).where(
                    _P.c.session_key == key, _P.c.expires > now
                )
            ).first()
            if row is None:
                return None
            closed = conn.execute(select(_C.c.seq).where(_C.c.session_id == key)).first()
        if closed is not None:
            return None
        return bytes.fromhex(row.instance), float(row.expires)
