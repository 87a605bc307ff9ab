"""SageMaker instance types: the vCPUs and memory each stands for, in one place.

The gateway's memory budget counts instances by their type's memory, and a backend that
places instances on a cluster asks for these resources. An ``InstanceType`` not listed
here counts as no memory (and its vCPUs as unknown): shipyard serves it, unmeasured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    vcpus: int
    memory_bytes: int


def _family(prefix: str, sizes: Mapping[str, tuple[int, float]]) -> dict[str, InstanceType]:
    return {
        f"ml.{prefix}.{size}": InstanceType(f"ml.{prefix}.{size}", vcpus, int(gib * GIB))
        for size, (vcpus, gib) in sizes.items()
    }


_GENERAL = {  # m4, m5, m6i, m7i: 4 GiB per vCPU
    "large": (2, 8), "xlarge": (4, 16), "2xlarge": (8, 32), "4xlarge": (16, 64),
    "8xlarge": (32, 128), "12xlarge": (48, 192), "16xlarge": (64, 256), "24xlarge": (96, 384),
}  # fmt: skip
_COMPUTE = {  # c5, c6i, c7i: 2 GiB per vCPU
    "large": (2, 4), "xlarge": (4, 8), "2xlarge": (8, 16), "4xlarge": (16, 32),
    "9xlarge": (36, 72), "12xlarge": (48, 96), "18xlarge": (72, 144), "24xlarge": (96, 192),
}  # fmt: skip
_MEMORY = {  # r5, r6i: 8 GiB per vCPU
    "large": (2, 16), "xlarge": (4, 32), "2xlarge": (8, 64), "4xlarge": (16, 128),
    "8xlarge": (32, 256), "12xlarge": (48, 384), "16xlarge": (64, 512), "24xlarge": (96, 768),
}  # fmt: skip
_BURSTABLE = {"medium": (2, 4), "large": (2, 8), "xlarge": (4, 16), "2xlarge": (8, 32)}
_G4DN = {"xlarge": (4, 16), "2xlarge": (8, 32), "4xlarge": (16, 64), "8xlarge": (32, 128),
         "12xlarge": (48, 192), "16xlarge": (64, 256)}  # fmt: skip
_G5 = {"xlarge": (4, 16), "2xlarge": (8, 32), "4xlarge": (16, 64), "8xlarge": (32, 128),
       "12xlarge": (48, 192), "16xlarge": (64, 256), "24xlarge": (96, 384),
       "48xlarge": (192, 768)}  # fmt: skip
_P3 = {"2xlarge": (8, 61), "8xlarge": (32, 244), "16xlarge": (64, 488)}
_INF1 = {"xlarge": (4, 8), "2xlarge": (8, 16), "6xlarge": (24, 48), "24xlarge": (96, 192)}

INSTANCE_TYPES: dict[str, InstanceType] = {
    **_family("t2", _BURSTABLE),
    **_family("t3", _BURSTABLE),
    **_family("m4", {k: v for k, v in _GENERAL.items() if k not in ("8xlarge", "12xlarge")}),
    **_family("m5", _GENERAL),
    **_family("m6i", _GENERAL),
    **_family("m7i", _GENERAL),
    **_family(
        "c4",
        {
            "large": (2, 3.75),
            "xlarge": (4, 7.5),
            "2xlarge": (8, 15),
            "4xlarge": (16, 30),
            "8xlarge": (36, 60),
        },
    ),  # fmt: skip
    **_family("c5", _COMPUTE),
    **_family("c6i", _COMPUTE),
    **_family("c7i", _COMPUTE),
    **_family("r5", _MEMORY),
    **_family("r6i", _MEMORY),
    **_family("g4dn", _G4DN),
    **_family("g5", _G5),
    **_family("p3", _P3),
    **_family("inf1", _INF1),
}


def memory_bytes(instance_type: str) -> int:
    """The memory ``instance_type`` stands for; 0 when the type is not in the table."""
    known = INSTANCE_TYPES.get(instance_type)
    return known.memory_bytes if known else 0
