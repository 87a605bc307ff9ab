"""``processing.json``: what one processing job's runner does, written by the gateway.

The gateway turns a CreateProcessingJob request into this once (processing/service.py
decides the command; supervisor.py writes it); the runner (runner.py) reads it and
never the request, apart from echoing it to the script as
``/opt/ml/config/processingjobconfig.json``. The rest of the working folder's protocol
(``status.jsonl``, ``job.log``, the PID files) is the training runner's
(job_contract.py).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

from pydantic import TypeAdapter, ValidationError

PROCESSING_FILE = "processing.json"
OPT_ML = PurePosixPath("/opt/ml")
PROCESSING_ROOT = OPT_ML / "processing"
"""Where every input's and output's LocalPath lies."""
MESSAGE_FILE = "output/message"
"""Below ``/opt/ml``: what the script says of its end; the first KB is the ExitMessage."""
EXIT_MESSAGE_BYTES = 1024
CAPTURE_INPUT = "endpoint_input_1"
"""A monitoring run's input of the endpoint's captured records: nothing captured yet is
no error of the fetch (the analyzer then says the job had no data)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Input:
    """A ProcessingInput's S3Input: ``uri`` fetched to ``local_path`` before the script."""

    name: str
    uri: str
    local_path: str
    data_type: str = "S3Prefix"
    """``S3Prefix`` (the objects under ``uri``) or ``ManifestFile`` (those it lists)."""
    missing_ok: bool = False
    """Nothing at ``uri`` fetches nothing rather than failing the job (CAPTURE_INPUT)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """A ProcessingOutput's S3Output: the files under ``local_path`` sent to ``uri`` once
    the script has exited 0."""

    name: str
    uri: str
    local_path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessingSpec:
    """One processing job, as its runner runs it."""

    name: str
    arn: str
    command: tuple[str, ...]
    """The process started, in the job's private ``/opt/ml`` view: the entrypoint with
    ``python3`` made the gateway's interpreter, then ContainerArguments."""
    started_at: float
    """Epoch seconds when the job was created; ``max_runtime_s`` counts from here."""
    environment: Mapping[str, str] = field(default_factory=dict)
    """The script's whole process environment (the request's Environment)."""
    inputs: tuple[Input, ...] = ()
    outputs: tuple[Output, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)
    """``/opt/ml/config/processingjobconfig.json``: the request."""
    max_runtime_s: float | None = None
    stop_grace_s: float = 120.0

    def locations(self) -> list[str]:
        return [*(i.uri for i in self.inputs), *(o.uri for o in self.outputs)]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> ProcessingSpec:
        """Parse ``processing.json``; ValueError naming the field when it is not one."""
        try:
            return _adapter().validate_json(text)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or 'job'}: {error['msg']}"
                for error in exc.errors()
            )
            raise ValueError(f"invalid {PROCESSING_FILE}: {problems}") from exc


@functools.cache
def _adapter() -> TypeAdapter[ProcessingSpec]:
    return TypeAdapter(ProcessingSpec)


def below_opt_ml(local_path: str) -> PurePosixPath | None:
    """``local_path`` relative to ``/opt/ml`` when it lies under ``/opt/ml/processing``
    (and climbs nowhere); None otherwise."""
    path = PurePosixPath(local_path)
    if not path.is_absolute() or ".." in path.parts or not path.is_relative_to(PROCESSING_ROOT):
        return None
    if path == PROCESSING_ROOT:
        return None
    return path.relative_to(OPT_ML)
