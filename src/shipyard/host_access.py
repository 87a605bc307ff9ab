"""What callers may make this host do: run commands, name local files (DESIGN 2.9).

Built once from the stack file's ``auth:`` section and handed to every service that
accepts a location or an image. Without ``auth:`` the gateway is for local use and
everything is allowed; with it, commands are refused unless ``allow_commands`` and local
paths must lie under one of ``file_roots``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from shipyard.errors import InvalidParameter
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
            file_roots=tuple(Path(os.path.realpath(root)) for root in auth.file_roots),
        )

    def check_image(self, image: str, field: str) -> None:
        """Refuse a ``cmd:`` image when commands are not allowed."""
        if image.startswith("cmd:") and not self.allow_commands:
            raise InvalidParameter(
                f"{field}: {image[:80]!r} runs a command on the gateway's host, which this "
                "gateway's auth.allow_commands does not allow."
            )

    def check_entrypoint(self, entrypoint: object, field: str) -> None:
        """Refuse a ``ContainerEntrypoint`` when commands are not allowed."""
        if entrypoint and not self.allow_commands:
            raise InvalidParameter(
                f"{field}: a container entrypoint runs a command on the gateway's host, which "
                "this gateway's auth.allow_commands does not allow."
            )

    def check_location(self, uri: str | None, field: str) -> None:
        """Refuse a ``file://`` or plain-path location outside ``file_roots``.

        The path is resolved first (``..`` and symbolic links followed; for a path that
        does not exist yet, its deepest existing parent), so neither can lead out.
        ``s3://`` and other schemes are not local files and are not checked here.
        """
        if self.file_roots is None or not uri:
            return
        path = local_path(uri)
        if path is None:
            return
        if "\x00" in path:
            raise InvalidParameter(f"{field}: a path may not contain a NUL character.")
        real = Path(os.path.realpath(path))
        if not any(real == root or real.is_relative_to(root) for root in self.file_roots):
            roots = ", ".join(str(r) for r in self.file_roots) or "none"
            raise InvalidParameter(
                f"{field}: {uri[:200]!r} is outside the folders this gateway may read and "
                f"write (auth.file_roots: {roots})."
            )

    def check_locations(self, uris: Iterable[tuple[str, str | None]]) -> None:
        for field, uri in uris:
            self.check_location(uri, field)


def local_path(uri: str) -> str | None:
    """The local path a ``file://`` URI or plain path names; None for other schemes."""
    if uri.startswith("file:"):
        parsed = urlsplit(uri)
        if parsed.netloc not in ("", "localhost"):
            return unquote(f"//{parsed.netloc}{parsed.path}")  # a UNC-like host: never a root
        return unquote(parsed.path) or "/"
    if "://" in uri:
        return None
    return uri if uri.startswith("/") else os.path.abspath(uri)
