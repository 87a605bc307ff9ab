"""What every part of a gateway is built on: its settings and stack file, the one
metadata store, the one object store, the metrics, the host-access rules, tagging and the
event dispatcher's wake-up.

app.py builds one Core and hands it to each package's ``assembly.py``, which builds that
package's services and loops from it; a package needing something new from the gateway
finds it here rather than in another constructor argument threaded through app.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shipyard.host_access import HostAccess
from shipyard.leases import Leases
from shipyard.metrics import Metrics
from shipyard.settings import Settings
from shipyard.stackfile import StackFile
from shipyard.storage.filesystems import Filesystems
from shipyard.storage.leases import LeaseStore
from shipyard.storage.metadata import MetadataStore
from shipyard.storage.objects import ObjectStore
from shipyard.storage.tags import Tagging, TagStore


@dataclass(frozen=True)
class Core:
    """One gateway's shared parts (see the module's docstring)."""

    settings: Settings
    stack: StackFile
    store: MetadataStore
    metrics: Metrics
    filesystems: Filesystems
    """The one storage layer: every store of this gateway reaches S3 through it, and
    opens no local file a caller names outside ``auth.file_roots``."""
    objects: ObjectStore
    """The one object store (data capture, async inputs and outputs, transforms); it
    reaches S3 and opens local files only through the host-access rules."""
    host_access: HostAccess
    tagging: Tagging
    on_event: Callable[[], None]
    """Wakes the event dispatcher: called after a transaction that recorded an event."""

    @classmethod
    def of(
        cls,
        settings: Settings,
        stack: StackFile,
        *,
        store: MetadataStore,
        metrics: Metrics,
        on_event: Callable[[], None],
    ) -> Core:
        """The core of a gateway with these settings, stack file and store: its file
        systems and object store held to the stack file's host-access rules."""
        host_access = HostAccess.from_auth(stack.auth, home=settings.home)
        filesystems = Filesystems(
            s3_endpoint_url=settings.s3_endpoint_url, file_roots=host_access.file_roots
        )
        return cls(
            settings=settings,
            stack=stack,
            store=store,
            metrics=metrics,
            filesystems=filesystems,
            objects=ObjectStore(filesystems=filesystems),
            host_access=host_access,
            tagging=Tagging(store=TagStore(store.engine)),
            on_event=on_event,
        )

    def leases(self, kind: str) -> Leases:
        """This gateway's leases on resources of ``kind``: what it runs of them when
        other gateways share the store (leases.py)."""
        return Leases(
            store=LeaseStore(self.store.engine, holder=self.settings.identity),
            kind=kind,
            lease_s=self.settings.lease_s,
            renew_s=self.settings.lease_renew_s,
        )
