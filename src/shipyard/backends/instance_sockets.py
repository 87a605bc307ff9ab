"""The Unix sockets the local backend binds for its built-in runtime instances.

A built-in runtime instance also serves on a Unix socket, and the gateway that started
it sends its requests there (http/client.py): on one host that costs both processes
less than TCP on loopback. The backend binds the socket itself, in a folder only the
gateway's user reads and no sandbox is shown (``<temp>/shipyard-*/<n>.sock``), and
hands the instance the bound socket (``--unix-socket-fd``): the instance never names,
creates or replaces a file there, so it cannot point the gateway's connections anywhere
else. Its TCP port stays what the container contract and ``/ping`` use, and what every
other gateway reads from the store. A warm spare is handed the bound socket with its
work (backends/spares.py).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(slots=True)
class UnixListener:
    """An instance's Unix socket, bound by the backend: its path, and the socket until
    the instance's process holds it."""

    path: Path
    sock: socket.socket


class InstanceSockets:
    """Binds each instance's socket in one folder of this gateway's, made on first use
    and removed by ``close``."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self._names = itertools.count(1)
        """Each instance's socket a name of its own: a stopped instance's clean-up never
        removes a later one's that took its port."""

    def __repr__(self) -> str:
        return f"InstanceSockets(folder={self._folder and str(self._folder)!r})"

    def bind(self, port: int) -> UnixListener | None:
        """A Unix socket for the instance on ``port``, bound (readable and writable by
        this user alone) in this folder; None where the temporary folder's path is too
        long for a socket's address (108 bytes) or it cannot be made: the instance is
        then reached on its port alone."""
        sock = None
        try:
            if self._folder is None:
                self._folder = Path(tempfile.mkdtemp(prefix="shipyard-"))  # mode 0700
            path = self._folder / f"{next(self._names)}.sock"
            if len(os.fsencode(path)) >= 100:
                return None
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            os.chmod(path, 0o600)
        except OSError as exc:
            if sock is not None:
                sock.close()
            log.warning("no Unix socket for the instance on port %s: %s", port, exc)
            return None
        return UnixListener(path, sock)

    def close(self) -> None:
        """Remove the folder, and every socket left in it."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
