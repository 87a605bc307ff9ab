"""CaptureConfig: an endpoint config's DataCaptureConfig, in plain words.

The endpoint config keeps the request as sent (``EndpointConfig.raw``), so the capture
settings are read back from there rather than stored twice; the control plane checks
them before anything is stored (gateway/api/actions/data_capture.py), and ``from_wire``
trusts what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shipyard.records import EndpointConfig

DEFAULT_CSV_TYPES = ("text/csv",)
DEFAULT_JSON_TYPES = ("application/json",)
"""SageMaker's defaults when CaptureContentTypeHeader does not list a kind."""


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """What to capture of an endpoint's invocations, and where to write it."""

    enabled: bool
    """EnableCapture (default true): off keeps the settings but captures nothing."""
    sampling_percentage: int
    """InitialSamplingPercentage, 0-100: the share of invocations captured."""
    destination: str
    """DestinationS3Uri: an s3:// or file:// prefix; files go under
    ``<destination>/<endpoint>/<variant>/yyyy/mm/dd/hh/``."""
    capture_input: bool
    capture_output: bool
    csv_content_types: tuple[str, ...] = DEFAULT_CSV_TYPES
    """Content types whose bodies are written as text with encoding CSV."""
    json_content_types: tuple[str, ...] = DEFAULT_JSON_TYPES
    """Content types whose bodies are written as text with encoding JSON; any other
    body is written BASE64."""
    kms_key_id: str | None = None
    """Accepted and described; objects are written with the destination's own
    encryption settings."""

    @classmethod
    def from_wire(cls, c: dict[str, Any]) -> CaptureConfig:
        """From a DataCaptureConfig the control plane has checked."""
        modes = {o["CaptureMode"] for o in c["CaptureOptions"]}
        header = c.get("CaptureContentTypeHeader") or {}
        return cls(
            enabled=bool(c.get("EnableCapture", True)),
            sampling_percentage=int(c["InitialSamplingPercentage"]),
            destination=c["DestinationS3Uri"],
            capture_input=bool(modes & {"Input", "InputAndOutput"}),
            capture_output=bool(modes & {"Output", "InputAndOutput"}),
            csv_content_types=_types(header.get("CsvContentTypes"), DEFAULT_CSV_TYPES),
            json_content_types=_types(header.get("JsonContentTypes"), DEFAULT_JSON_TYPES),
            kms_key_id=c.get("KmsKeyId") or None,
        )

    def describe(self) -> dict[str, Any]:
        """DescribeEndpoint's DataCaptureConfig (DataCaptureConfigSummary)."""
        out: dict[str, Any] = {
            "EnableCapture": self.enabled,
            "CaptureStatus": "Started" if self.enabled else "Stopped",
            "CurrentSamplingPercentage": self.sampling_percentage,
            "DestinationS3Uri": self.destination,
        }
        if self.kms_key_id is not None:
            out["KmsKeyId"] = self.kms_key_id
        return out


def capture_of(config: EndpointConfig) -> CaptureConfig | None:
    """The config's DataCaptureConfig, or None when it has none."""
    wire = config.raw.get("DataCaptureConfig")
    return CaptureConfig.from_wire(wire) if isinstance(wire, dict) else None


def _types(listed: list[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    # Compared without parameters and case, as content types are (RFC 9110).
    return tuple(t.strip().lower() for t in listed) if listed else default
