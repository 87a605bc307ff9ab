"""What callers may make this host do: run commands, name local files (DESIGN 2.9).

Built once from the stack file's ``auth:`` section and handed to every service that
accepts a location or an image. Without ``auth:`` the gateway is for local use and
everything is allowed; with it, commands are refused unless ``allow_commands`` and local
paths must lie under one of ``file_roots``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shipyard.settings import AuthConfig


@dataclass(frozen=True, slots=True)
class HostAccess:
    """The host-level powers a caller has; see the module."""

    allow_commands: bool = True
    """``cmd:`` images and ``ContainerEntrypoint`` may run commands on this host."""
    file_roots: tuple[Path, ...] | None = None
    """Folders local locations must lie under; None means anywhere (no ``auth:``)."""

    @classmethod
    def from_auth(cls, auth: AuthConfig | None) -> HostAccess:
        if auth is None:
            return cls()
        return cls(
            allow_commands=auth.allow_commands,
            file_roots=tuple(root.resolve() for root in auth.file_roots),
        )
