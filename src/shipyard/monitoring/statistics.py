"""A dataset's ``statistics.json`` and a baseline's ``constraints.json``, in Model
Monitor's formats (docs/guides/model-monitoring.md shows both).

Numbers are numpy's: every column is one float64 array, and its count, sum, mean,
population standard deviation, extremes and 10-bucket histogram are numpy's
vectorised reductions (``np.histogram`` over [min, max]). numpy is a dependency of the
gateway already, well kept, and fast enough that 100,000 records are read and summed
in a fraction of the bench's budget (bench/results/model_monitor.txt); scipy or pandas
would add a large install for the same few reductions.

The ``kll`` sketch is our own (:class:`Kll`), not a library's: its shape (levels of
items, each level weighing twice the one below, under ``parameters`` ``c`` and ``k``)
is the one Model Monitor writes and reads back, and the few KLL packages on PyPI keep
their own formats. Built from a whole column at once, it keeps every item while they
fit in ``k`` (so small datasets' distances are exact), and otherwise compacts level by
level as KLL does: sort, keep every other item, promote it with twice the weight.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shipyard.monitoring.dataset import Column, Dataset

KLL_K = 2048
KLL_C = 0.64
BUCKETS = 10
DOMAIN_SHARE = 0.1
"""A String feature gets ``domains`` when its distinct values are at most this share of
its present values."""

INTEGRAL, FRACTIONAL, STRING = "Integral", "Fractional", "String"


@dataclass(frozen=True, slots=True)
class Kll:
    """A KLL sketch: ``levels[h]`` holds items that each stand for ``2**h`` values."""

    levels: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, values: np.ndarray, *, k: int = KLL_K, c: float = KLL_C) -> Kll:
        levels = [np.sort(values)]
        while True:
            depth = len(levels)
            over = [h for h, items in enumerate(levels) if len(items) > _capacity(h, depth, k, c)]
            if not over:
                return cls(tuple(levels))
            h = over[0]
            items = np.sort(levels[h])
            leftover = items[len(items) - len(items) % 2 :]  # an odd one out stays
            kept = items[: len(items) - len(leftover)][h % 2 :: 2]  # KLL's coin, alternated
            levels[h] = leftover
            if h + 1 == len(levels):
                levels.append(kept)
            else:
                levels[h + 1] = np.concatenate([levels[h + 1], kept])

    @classmethod
    def from_json(cls, sketch: dict[str, Any]) -> Kll:
        return cls(tuple(np.asarray(level, dtype=np.float64) for level in sketch["data"]))

    def to_json(self) -> dict[str, Any]:
        return {
            "parameters": {"c": KLL_C, "k": float(KLL_K)},
            "data": [[float(x) for x in level] for level in self.levels],
        }

    def cdf(self, at: np.ndarray) -> np.ndarray:
        """The share of the values at most each of ``at``."""
        items = np.concatenate(self.levels) if self.levels else np.empty(0)
        weights = (
            np.concatenate([np.full(len(level), 2.0**h) for h, level in enumerate(self.levels)])
            if self.levels
            else np.empty(0)
        )
        if not len(items):
            return np.zeros(len(at))
        order = np.argsort(items, kind="stable")
        items, cumulative = items[order], np.cumsum(weights[order])
        found = np.searchsorted(items, at, side="right")
        below = np.where(found > 0, cumulative[np.maximum(found - 1, 0)], 0.0)
        return np.asarray(below / cumulative[-1], dtype=np.float64)

    def items(self) -> np.ndarray:
        return np.concatenate(self.levels) if self.levels else np.empty(0)


def _capacity(h: int, depth: int, k: int, c: float) -> int:
    return max(2, math.ceil(k * c ** (depth - 1 - h)))


def distance(baseline: Kll, current: Kll) -> float:
    """The largest gap between the two sketches' CDFs, over all their items."""
    at = np.unique(np.concatenate([baseline.items(), current.items()]))
    if not len(at):
        return 0.0
    return float(np.max(np.abs(baseline.cdf(at) - current.cdf(at))))


def inferred_type(column: Column) -> str:
    """Integral if every present value is an integer, Fractional if a number, else String."""
    if column.present == 0:
        return STRING
    if column.integers == column.present:
        return INTEGRAL
    if column.numbers == column.present:
        return FRACTIONAL
    return STRING


def statistics(dataset: Dataset) -> dict[str, Any]:
    """``statistics.json`` of ``dataset``, its features in column order."""
    return {
        "version": 0.0,
        "dataset": {"item_count": dataset.items},
        "features": [_feature(column, dataset.items) for column in dataset.columns],
    }


def _feature(column: Column, items: int) -> dict[str, Any]:
    kind = inferred_type(column)
    common = {"num_present": column.present, "num_missing": items - column.present}
    if kind == STRING:
        counts = Counter(column.strings())
        return {
            "name": column.name,
            "inferred_type": kind,
            "string_statistics": {
                "common": common,
                "distinct_count": float(len(counts)),
                "distribution": {
                    "categorical": {
                        "buckets": [{"value": v, "count": n} for v, n in counts.most_common()]
                    }
                },
            },
        }
    values = column.floats()
    return {
        "name": column.name,
        "inferred_type": kind,
        "numerical_statistics": {
            "common": common,
            "mean": float(values.mean()),
            "sum": float(values.sum()),
            "std_dev": float(values.std()),
            "min": float(values.min()),
            "max": float(values.max()),
            "distribution": {"kll": _kll(values)},
        },
    }


def _kll(values: np.ndarray) -> dict[str, Any]:
    low, high = float(values.min()), float(values.max())
    counts, edges = np.histogram(values, bins=BUCKETS, range=(low, high))
    buckets = [
        {"lower_bound": float(edges[i]), "upper_bound": float(edges[i + 1]), "count": float(n)}
        for i, n in enumerate(counts)
    ]
    return {"buckets": buckets, "sketch": Kll.of(values).to_json()}


def constraints(
    stats: dict[str, Any], *, categorical_drift_method: str = "LInfinity"
) -> dict[str, Any]:
    """``constraints.json`` suggested from a baseline's ``statistics.json``."""
    items = stats["dataset"]["item_count"]
    features = []
    for feature in stats["features"]:
        entry: dict[str, Any] = {
            "name": feature["name"],
            "inferred_type": feature["inferred_type"],
            "completeness": _completeness(feature, items),
        }
        if "numerical_statistics" in feature:
            minimum = feature["numerical_statistics"]["min"]
            entry["num_constraints"] = {"is_non_negative": bool(minimum >= 0)}
        else:
            string = feature["string_statistics"]
            present = string["common"]["num_present"]
            buckets = string["distribution"]["categorical"]["buckets"]
            if present and len(buckets) <= DOMAIN_SHARE * present:
                entry["string_constraints"] = {"domains": [b["value"] for b in buckets]}
        features.append(entry)
    return {
        "version": 0.0,
        "features": features,
        "monitoring_config": {
            "evaluate_constraints": "Enabled",
            "emit_metrics": "Enabled",
            "datatype_check_threshold": 1.0,
            "domain_content_threshold": 1.0,
            "distribution_constraints": {
                "perform_comparison": "Enabled",
                "comparison_threshold": 0.1,
                "comparison_method": "Robust",
                "categorical_comparison_threshold": 0.1,
                "categorical_drift_method": categorical_drift_method,
            },
        },
    }


def _completeness(feature: dict[str, Any], items: int) -> float:
    kind = "numerical_statistics" if "numerical_statistics" in feature else "string_statistics"
    present = feature[kind]["common"]["num_present"]
    return present / items if items else 0.0


def shares(buckets: Sequence[dict[str, Any]]) -> dict[str, float]:
    """A categorical distribution's buckets as each value's share."""
    total = sum(float(b["count"]) for b in buckets)
    return {str(b["value"]): float(b["count"]) / total for b in buckets} if total else {}
