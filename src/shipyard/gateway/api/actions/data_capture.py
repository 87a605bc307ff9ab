"""DataCaptureConfig on the control plane: checked at CreateEndpointConfig, described
by DescribeEndpoint.

The botocore model the control door validates against already enforces the ranges,
enums and list lengths (InitialSamplingPercentage 0-100, CaptureMode, up to 10 content
types of each kind). What it cannot say is checked here: a mode listed twice, and a
destination this gateway can write to (s3://, file:// or an absolute path, inside the
folders ``auth.file_roots`` allows).
"""

from __future__ import annotations

from typing import Any

from shipyard.capture.config import CaptureConfig, capture_of
from shipyard.errors import InvalidParameter
from shipyard.host_access import HostAccess
from shipyard.records import EndpointConfig

_FIELD = "DataCaptureConfig"


def check_data_capture(wire: dict[str, Any], host_access: HostAccess) -> CaptureConfig:
    """The config's DataCaptureConfig, or InvalidParameter saying what is wrong."""
    modes = [o["CaptureMode"] for o in wire["CaptureOptions"]]
    covered: list[str] = []
    for mode in modes:
        parts = ["Input", "Output"] if mode == "InputAndOutput" else [mode]
        if any(p in covered for p in parts):
            raise InvalidParameter(
                f"{_FIELD}.CaptureOptions: {modes} captures {'/'.join(parts)} more than once; "
                "list Input and Output at most once each."
            )
        covered += parts
    percentage = wire["InitialSamplingPercentage"]
    if not 0 <= percentage <= 100:
        raise InvalidParameter(
            f"{_FIELD}.InitialSamplingPercentage is {percentage}; it must be from 0 to 100."
        )
    uri = wire["DestinationS3Uri"]
    if not _writable_here(uri):
        raise InvalidParameter(
            f"{_FIELD}.DestinationS3Uri: {uri[:200]!r} is not an s3://bucket/prefix or "
            "file:// URI or an absolute path."
        )
    host_access.check_location(uri, f"{_FIELD}.DestinationS3Uri")
    return CaptureConfig.from_wire(wire)


def describe_data_capture(config: EndpointConfig | None) -> dict[str, Any] | None:
    """DescribeEndpoint's DataCaptureConfig for the config the endpoint runs, if any."""
    capture = capture_of(config) if config is not None else None
    return capture.describe() if capture is not None else None


def _writable_here(uri: str) -> bool:
    if uri.startswith("s3://"):
        return bool(uri.removeprefix("s3://").split("/", 1)[0])
    return uri.startswith(("file:///", "/"))
