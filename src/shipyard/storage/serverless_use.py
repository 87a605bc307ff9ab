"""ServerlessUseStore: what the gateways that do not hold a serverless endpoint's lease
need of its instances, for the gateway that does.

A serverless variant's instances are started for demand and stopped once idle by the
gateway running its fleet (control/serverless.py), which sees only its own requests.
Every other gateway routes to the same instances (control/mirror.py) and says here, per
variant, how many instances its requests need now (``wanted``) and that it used them:
one row per (endpoint, variant, gateway), whose ``uses`` grows by one at each write. The
holder reads the rows of the endpoints it holds and acts on those whose ``uses`` moved,
so no clock is compared between hosts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sqlalchemy import Engine, select

from shipyard.storage import tables as t
from shipyard.storage.transactions import transaction, upsert

_U = t.serverless_use
_WRAP = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Use:
    """One gateway's last word on one serverless variant."""

    endpoint: str
    variant: str
    gateway: str
    wanted: int
    uses: int


class ServerlessUseStore:
    """Writes this gateway's use of serverless variants; reads the other gateways'."""

    def __init__(self, engine: Engine, *, gateway: str) -> None:
        self.engine = engine
        self.gateway = gateway

    def __repr__(self) -> str:
        return f"ServerlessUseStore(gateway={self.gateway!r})"

    def note(self, wanted: Mapping[tuple[str, str], int]) -> None:
        """Per (endpoint, variant), the instances this gateway's requests need now; each
        row's ``uses`` moves on by one."""
        if not wanted:
            return
        statement = upsert(self.engine.dialect.name, _U)
        statement = statement.on_conflict_do_update(
            index_elements=[_U.c.endpoint, _U.c.variant, _U.c.gateway],
            # Only a change is read: it wraps well below the column's 32 bits.
            set_={"wanted": statement.excluded.wanted, "uses": _U.c.uses % _WRAP + 1},
        )
        # In one order on every gateway, so two writing at once never deadlock.
        rows = [
            {"endpoint": e, "variant": v, "gateway": self.gateway, "wanted": n, "uses": 1}
            for (e, v), n in sorted(wanted.items())
        ]
        with transaction(self.engine) as conn:
            conn.execute(statement, rows)

    def read(self, endpoints: Collection[str]) -> list[Use]:
        """What the other gateways last said of the serverless variants of ``endpoints``."""
        query = select(_U).where(_U.c.endpoint.in_(sorted(endpoints)), _U.c.gateway != self.gateway)
        with transaction(self.engine) as conn:
            return [Use(**row) for row in conn.execute(query).mappings()]
