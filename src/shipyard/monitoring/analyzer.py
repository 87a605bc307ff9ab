"""``python -m shipyard.monitoring.analyzer``: the built-in Model Monitor analyzer.

A processing job whose image is Model Monitor's analyzer runs this instead
(processing/service.py), configured as that container is, by environment variables:

- ``dataset_format``: ``{"csv": {"header": true}}``, ``{"json": {"lines": true}}`` or
  ``{"sagemakerCaptureJson": {...}}`` (an endpoint's captured records);
- ``dataset_source``: the folder (or file) of the dataset; ``output_path``: where the
  results go;
- ``baseline_statistics`` / ``baseline_constraints``: a monitoring run's baseline; without
  ``baseline_constraints`` the job is a baselining job;
- ``start_time`` / ``end_time`` (``YYYY-MM-DDTHH:MM:SSZ``): a run's window of
  ``inferenceTime``; ``publish_cloudwatch_metrics``: ``Enabled`` or ``Disabled``.

A baselining job writes ``statistics.json`` and ``constraints.json``; a monitoring run
writes the window's ``statistics.json`` and ``constraint_violations.json``, its
``/opt/ml/output/message`` saying how many violations it found and, when publishing is
on, ``/opt/ml/output/metrics.json`` for the gateway to put (monitoring/runs.py). A
window without records exits 1 with ``Job inputs had no data``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from shipyard.monitoring.dataset import (
    Dataset,
    files,
    read_capture,
    read_csv,
    read_json_lines,
)
from shipyard.monitoring.messages import NO_DATA, exit_message
from shipyard.monitoring.statistics import constraints, statistics
from shipyard.monitoring.violations import check, type_shares

MESSAGE = Path("/opt/ml/output/message")
METRICS = Path("/opt/ml/output/metrics.json")


class AnalysisError(Exception):
    """The job cannot be analysed as configured; the message says why."""


def analyse(environ: Mapping[str, str], *, message: Path, metrics: Path) -> int:
    """Run the analysis ``environ`` describes; return the violations found (0 when
    baselining).

    Raises:
        AnalysisError: a setting is missing or wrong, or there is no data.
    """
    source = Path(_required(environ, "dataset_source"))
    output = Path(_required(environ, "output_path"))
    output.mkdir(parents=True, exist_ok=True)
    try:
        dataset_format = json.loads(environ.get("dataset_format") or '{"csv": {"header": true}}')
    except ValueError as exc:
        raise AnalysisError(f"dataset_format is not JSON: {exc}") from None
    baseline_stats = _json_file(environ.get("baseline_statistics"))
    baseline_constraints = _json_file(environ.get("baseline_constraints"))
    names = [f["name"] for f in (baseline_stats or baseline_constraints or {}).get("features", [])]
    dataset = _read(dataset_format, source, names, environ)
    if dataset.items == 0:
        raise AnalysisError(NO_DATA)
    stats = statistics(dataset)
    _write(output / "statistics.json", stats)
    if baseline_constraints is None:
        method = environ.get("categorical_drift_method") or "LInfinity"
        _write(output / "constraints.json", constraints(stats, categorical_drift_method=method))
        return 0
    violations, drifts = check(dataset, stats, baseline_stats or {}, baseline_constraints)
    _write(output / "constraint_violations.json", {"violations": violations})
    if environ.get("publish_cloudwatch_metrics", "Enabled") == "Enabled":
        present = {f["name"]: _present_share(f, dataset.items) for f in stats["features"]}
        _write(
            metrics,
            {
                "drift": {d.feature: d.distance for d in drifts},
                "non_null": present,
                "data": type_shares(dataset, baseline_constraints),
            },
        )
    message.parent.mkdir(parents=True, exist_ok=True)
    message.write_text(exit_message(len(violations)))
    return len(violations)


def _read(
    dataset_format: dict[str, Any], source: Path, names: list[str], environ: Mapping[str, str]
) -> Dataset:
    found = files(source) if source.exists() else []
    if "sagemakerCaptureJson" in dataset_format:
        return read_capture(
            found,
            names=names,
            start=_time(environ.get("start_time")),
            end=_time(environ.get("end_time")),
        )
    if "json" in dataset_format:
        return read_json_lines(found)
    if "csv" in dataset_format:
        header = bool((dataset_format.get("csv") or {}).get("header", True))
        return read_csv(found, header=header)
    raise AnalysisError(f"dataset_format {json.dumps(dataset_format)[:200]} is not csv or json.")


def _present_share(feature: dict[str, Any], items: int) -> float:
    kind = "numerical_statistics" if "numerical_statistics" in feature else "string_statistics"
    return feature[kind]["common"]["num_present"] / items if items else 0.0


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise AnalysisError(f"{text!r} is not a time (YYYY-MM-DDTHH:MM:SSZ).") from None


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if not value:
        raise AnalysisError(f"The environment variable {name} is required.")
    return value


def _json_file(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    target = Path(path)
    if target.is_dir():  # a folder input holding the one file
        found = files(target)
        if not found:
            raise AnalysisError(f"{path} holds no file.")
        target = found[0]
    try:
        loaded = json.loads(target.read_text())
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"Could not read {path}: {exc}") from None
    if not isinstance(loaded, dict):
        raise AnalysisError(f"{path} is not a JSON object.")
    return loaded


def _write(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2))


def main() -> int:
    try:
        count = analyse(os.environ, message=MESSAGE, metrics=METRICS)
    except AnalysisError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(exit_message(count) if os.environ.get("baseline_constraints") else "Baseline suggested.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
