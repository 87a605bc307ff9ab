"""ServerlessUseStore: what the gateways that do not hold a serverless endpoint's lease
need of its instances, for the gateway that does.

A serverless variant's instances are started for demand and stopped once idle by the
gateway running its fleet (control/serverless.py), which sees only its own requests.
Every other gateway routes to the same instances (control/mirror.py) and says here, per
variant, how many instances its requests need now (``wanted``) and that it used them:
one row per (endpoint, variant, gateway), whose ``uses`` grows by one at each write. The
holder reads the rows of the endpoints it holds and acts on those whose ``uses`` moved,
so no clock is compared between hosts.

When a cold start the holder made fails with no instance of the variant left, the holder
writes on each row whose use it had read the ``uses`` it failed (``failed_uses``) and why
(``failure``): a gateway whose requests wait for that variant reads it back with its next
write, and fails those that asked before it, as the holder fails its own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sqlalchemy import Engine, bindparam, select, update

from shipyard.storage import tables as t
from shipyard.storage.transactions import transaction, upsert

_U = t.serverless_use
WRAP = 1_000_000_000
"""Where ``uses`` counts on from 1 again."""
_REASON_CHARS = 2048
"""Most of a failure's text kept (a model's traceback can run long)."""


@dataclass(frozen=True, slots=True)
class Use:
    """One gateway's last word on one serverless variant."""

    endpoint: str
    variant: str
    gateway: str
    wanted: int
    uses: int
    failed_uses: int = 0
    """The ``uses`` the holder had read when a cold start it made for them failed (0:
    none failed)."""
    failure: str | None = None
    """Why that cold start failed."""
    used: list[str] | None = None
    """The instances its requests were on since its last write, by id (None: not said,
    so any of them)."""
    active: int = 0
    """The requests it had admitted to the variant when it wrote (MaxConcurrency counts
    them in all, routing/serverless.py)."""


class ServerlessUseStore:
    """Writes this gateway's use of serverless variants; reads the other gateways'."""

    def __init__(self, engine: Engine, *, gateway: str) -> None:
        self.engine = engine
        self.gateway = gateway

    def __repr__(self) -> str:
        return f"ServerlessUseStore(gateway={self.gateway!r})"

    def note(
        self,
        wanted: Mapping[tuple[str, str], int],
        used: Mapping[tuple[str, str], Collection[str]] | None = None,
        active: Mapping[tuple[str, str], int] | None = None,
    ) -> dict[tuple[str, str], Use]:
        """Per (endpoint, variant), the instances this gateway's requests need now, those
        they were on (``used``, by id; none where not given) and the requests it has
        admitted (``active``; 0 where not given); each row's ``uses`` moves on by one.
        Returns the rows as written, by (endpoint, variant), with the holder's last
        failure on them."""
        if not wanted:
            return {}
        statement = upsert(self.engine.dialect.name, _U)
        statement = statement.on_conflict_do_update(
            index_elements=[_U.c.endpoint, _U.c.variant, _U.c.gateway],
            # Only a change is read: it wraps well below the column's 32 bits.
            set_={
                "wanted": statement.excluded.wanted,
                "used": statement.excluded.used,
                "active": statement.excluded.active,
                "uses": _U.c.uses % WRAP + 1,
            },
        )
        # In one order on every gateway, so two writing at once never deadlock.
        used = used or {}
        active = active or {}
        rows = [
            {
                "endpoint": e,
                "variant": v,
                "gateway": self.gateway,
                "wanted": n,
                "used": sorted(used.get((e, v), ())),
                "active": active.get((e, v), 0),
                "uses": 1,
            }
            for (e, v), n in sorted(wanted.items())
        ]
        mine = select(_U).where(
            _U.c.gateway == self.gateway, _U.c.endpoint.in_(sorted({e for e, _ in wanted}))
        )
        with transaction(self.engine) as conn:
            conn.execute(statement, rows)
            written = [Use(**row) for row in conn.execute(mine).mappings()]
        return {(u.endpoint, u.variant): u for u in written if (u.endpoint, u.variant) in wanted}

    def fail(self, failed: Mapping[tuple[str, str, str], int], reason: str) -> None:
        """A cold start for the uses read from these rows ((endpoint, variant, gateway)
        → ``uses``) failed, for ``reason``."""
        if not failed:
            return
        statement = (
            update(_U)
            .where(
                _U.c.endpoint == bindparam("e"),
                _U.c.variant == bindparam("v"),
                _U.c.gateway == bindparam("g"),
            )
            .values(failed_uses=bindparam("u"), failure=reason[:_REASON_CHARS])
        )
        rows = [{"e": e, "v": v, "g": g, "u": u} for (e, v, g), u in sorted(failed.items())]
        with transaction(self.engine) as conn:
            conn.execute(statement, rows)

    def read(self, endpoints: Collection[str]) -> list[Use]:
        """What the other gateways last said of the serverless variants of ``endpoints``."""
        query = select(_U).where(_U.c.endpoint.in_(sorted(endpoints)), _U.c.gateway != self.gateway)
        with transaction(self.engine) as conn:
            return [Use(**row) for row in conn.execute(query).mappings()]
