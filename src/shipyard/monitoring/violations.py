"""A monitoring run's ``constraint_violations.json``: a window's statistics held to the
baseline's constraints and statistics.

Checks, per feature of the baseline (each one entry at most):

- ``data_type_check``: the share of present values of the baseline's type (an Integral
  feature's integers, a Fractional one's numbers) is below ``datatype_check_threshold``;
- ``completeness_check``: the share of items with a value is below the feature's
  ``completeness``;
- ``baseline_drift_check``: a numeric feature's largest CDF gap between the two KLL
  sketches, or a String feature's largest category-share gap (``LInfinity``), is over
  ``comparison_threshold`` and, with the ``Robust`` method, over the two-sample
  Kolmogorov-Smirnov critical value at 5 % for the two counts;
- ``categorical_values_check``: the share of present values inside ``domains`` is below
  ``domain_content_threshold``;
- ``missing_column_check`` / ``extra_column_check``: a baseline column the window lacks,
  or a window column the baseline lacks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shipyard.monitoring.dataset import Column, Dataset
from shipyard.monitoring.statistics import FRACTIONAL, INTEGRAL, STRING, Kll, distance, shares

KS_ALPHA_05 = 1.358
"""c(α) of the two-sample Kolmogorov-Smirnov test at α = 0.05."""


@dataclass(frozen=True, slots=True)
class Drift:
    """A feature's distance to the baseline, for its ``feature_baseline_drift_`` metric."""

    feature: str
    distance: float


def check(
    dataset: Dataset, window: dict[str, Any], baseline: dict[str, Any], constraints: dict[str, Any]
) -> tuple[list[dict[str, str]], list[Drift]]:
    """The violations of ``dataset`` (whose statistics are ``window``), and each
    feature's drift distance."""
    config = constraints.get("monitoring_config") or {}
    distribution = config.get("distribution_constraints") or {}
    columns = {c.name: c for c in dataset.columns}
    stats = {f["name"]: f for f in window["features"]}
    base_stats = {f["name"]: f for f in baseline.get("features", [])}
    violations: list[dict[str, str]] = []
    drifts: list[Drift] = []
    names = [f["name"] for f in constraints.get("features", [])]
    for feature in constraints.get("features", []):
        name = feature["name"]
        column = columns.get(name)
        if column is None:
            violations.append(_missing(name, len(columns), len(names)))
            continue
        found = [
            _data_type(feature, column, config),
            _completeness(feature, column, dataset.items),
            _domain(feature, column, config),
        ]
        if name in base_stats and name in stats:
            gap = _drift(base_stats[name], stats[name])
            if gap is not None:
                drifts.append(Drift(name, gap))
                found.append(
                    _drift_violation(name, gap, base_stats[name], stats[name], distribution)
                )
        violations += [v for v in found if v is not None]
    for name in columns:
        if name not in names:
            violations.append(_extra(name, len(columns), len(names)))
    return violations, drifts


def type_shares(dataset: Dataset, constraints: dict[str, Any]) -> dict[str, float]:
    """Each baseline feature's share of present values of its baseline type (1.0 for a
    String feature, whose type every value has), for its ``feature_data_`` metric."""
    columns = {c.name: c for c in dataset.columns}
    found = {}
    for feature in constraints.get("features", []):
        column = columns.get(feature["name"])
        if column is None or column.present == 0:
            continue
        expected = feature.get("inferred_type")
        matching = {INTEGRAL: column.integers, FRACTIONAL: column.numbers}.get(
            str(expected), column.present
        )
        found[column.name] = matching / column.present
    return found


def _violation(name: str, kind: str, description: str) -> dict[str, str]:
    return {"feature_name": name, "constraint_check_type": kind, "description": description}


def _data_type(
    feature: dict[str, Any], column: Column, config: dict[str, Any]
) -> dict[str, str] | None:
    expected = feature.get("inferred_type")
    if expected not in (INTEGRAL, FRACTIONAL) or column.present == 0:
        return None
    matching = column.integers if expected == INTEGRAL else column.numbers
    share = matching / column.present
    threshold = float(config.get("datatype_check_threshold", 1.0))
    if share >= threshold:
        return None
    return _violation(
        column.name,
        "data_type_check",
        f"Data type match requirement is not met. Expected data type: {expected}, "
        f"Expected match: {threshold * 100:.1f}%. Observed: Only {share * 100:.1f}% of data "
        f"is {expected}.",
    )


def _completeness(feature: dict[str, Any], column: Column, items: int) -> dict[str, str] | None:
    expected = feature.get("completeness")
    if expected is None or items == 0:
        return None
    share = column.present / items
    if share >= float(expected):
        return None
    return _violation(
        column.name,
        "completeness_check",
        f"Data completeness requirement is not met. Expected completeness: "
        f"{float(expected) * 100:.1f}%. Observed: Only {share * 100:.1f}% of data is present.",
    )


def _domain(
    feature: dict[str, Any], column: Column, config: dict[str, Any]
) -> dict[str, str] | None:
    domains = (feature.get("string_constraints") or {}).get("domains")
    if not domains or column.present == 0:
        return None
    allowed = {str(d) for d in domains}
    values = column.strings()
    share = sum(1 for v in values if v in allowed) / len(values)
    threshold = float(config.get("domain_content_threshold", 1.0))
    if share >= threshold:
        return None
    return _violation(
        column.name,
        "categorical_values_check",
        f"Data content match requirement is not met. Expected match: {threshold * 100:.1f}%. "
        f"Observed: Only {share * 100:.1f}% of data is within the baseline's domain.",
    )


def _drift(base: dict[str, Any], current: dict[str, Any]) -> float | None:
    """The distance between two statistics of one feature; None when not comparable."""
    if base.get("inferred_type") == STRING or "numerical_statistics" not in current:
        if "string_statistics" not in base or "string_statistics" not in current:
            return None
        before = shares(base["string_statistics"]["distribution"]["categorical"]["buckets"])
        after = shares(current["string_statistics"]["distribution"]["categorical"]["buckets"])
        return max(
            (abs(before.get(v, 0.0) - after.get(v, 0.0)) for v in {*before, *after}), default=0.0
        )
    if "numerical_statistics" not in base:
        return None
    sketch = base["numerical_statistics"]["distribution"]["kll"]["sketch"]
    window = current["numerical_statistics"]["distribution"]["kll"]["sketch"]
    return distance(Kll.from_json(sketch), Kll.from_json(window))


def _drift_violation(
    name: str,
    gap: float,
    base: dict[str, Any],
    current: dict[str, Any],
    distribution: dict[str, Any],
) -> dict[str, str] | None:
    if distribution.get("perform_comparison", "Enabled") != "Enabled":
        return None
    threshold = float(distribution.get("comparison_threshold", 0.1))
    if gap <= threshold:
        return None
    if distribution.get("comparison_method", "Robust") == "Robust":
        n, m = _present(base), _present(current)
        if n and m and gap <= KS_ALPHA_05 * math.sqrt((n + m) / (n * m)):
            return None
    return _violation(
        name,
        "baseline_drift_check",
        f"Baseline drift distance: {gap} exceeds threshold: {threshold}",
    )


def _present(feature: dict[str, Any]) -> float:
    kind = "numerical_statistics" if "numerical_statistics" in feature else "string_statistics"
    return float(feature[kind]["common"]["num_present"])


def _missing(name: str, current: int, baseline: int) -> dict[str, str]:
    return _violation(
        name,
        "missing_column_check",
        f"There are missing columns in current dataset. Number of columns in current "
        f"dataset: {current}, Number of columns in baseline constraints: {baseline}",
    )


def _extra(name: str, current: int, baseline: int) -> dict[str, str]:
    return _violation(
        name,
        "extra_column_check",
        f"There are extra columns in current dataset. Number of columns in current "
        f"dataset: {current}, Number of columns in baseline constraints: {baseline}",
    )
