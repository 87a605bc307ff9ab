"""Network namespaces for a multi-node Ray cluster on one machine.

Each node gets a namespace of its own with one address on a private bridge, so nodes
really have different addresses and a node's processes bind nothing outside it. The
root namespace holds the bridge's own address, where the test's S3 server listens. Made
with ``ip`` (root only) and deleted by the fixture that made them.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        subprocess.run(["ip", "-V"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the ip command is missing: {exc}"
    return None


@dataclass
class Subnet:
    """A bridge in the root namespace and namespaces on it, one address each."""

    tag: str
    """Short and unique: interface names have at most 15 characters."""
    prefix: str
    """The /24's first three octets, e.g. ``10.213.7``."""
    namespaces: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"br{self.tag}"

    @property
    def gateway_ip(self) -> str:
        """The root namespace's address on the bridge."""
        return f"{self.prefix}.1"

    def create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str) -> tuple[str, str]:
        """A new namespace on the bridge; its name and address."""
        number = len(self.namespaces) + 2
        netns, outer, inner = f"sy{self.tag}{name}", f"v{self.tag}{name}", f"e{self.tag}{name}"
        address = f"{self.prefix}.{number}"
        _ip("netns", "add", netns)
        self.namespaces.append(netns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", netns)
        _ip("link", "set", outer, "master", self.bridge, "up")
        _ip("addr", "add", f"{address}/24", "dev", inner, netns=netns)
        _ip("link", "set", inner, "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        return netns, address

    def delete(self) -> None:
        """Remove the veth pairs, the namespaces and the bridge. A pair is deleted by its
        outer end, at once: one left to go with its namespace goes only once the kernel
        has torn the namespace down, after ``ip netns del`` returns, and the next subnet
        of this process (same tag) could not make a pair of that name meanwhile."""
        for netns in self.namespaces:
            outer = "v" + netns.removeprefix("sy")
            subprocess.run(["ip", "link", "del", outer], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)


def new_subnet() -> Subnet:
    tag = f"{os.getpid() % 10000:04d}"
    return Subnet(tag=tag, prefix=f"10.213.{os.getpid() % 250 + 1}")
