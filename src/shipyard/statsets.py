"""A statistic set: what CloudWatch keeps of the values of one metric in one period.

CloudWatch keeps ``SampleCount``, ``Sum``, ``Minimum`` and ``Maximum`` per period, and
answers percentiles (``p99``, ``p99.9``) from a distribution of the values. Ours is a
histogram of logarithmic buckets, each 5 % wider than the last, so a percentile is
within 2.5 % of the true value whatever the scale (microseconds or counts), and a
period's histogram has at most a few hundred buckets. Written by hand: this is the
domain's own arithmetic (merging sets across gateways and periods, CloudWatch's
statistic names), a few lines that no histogram library offers in this shape.
"""

from __future__ import annotations

import math
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat

_RATIO = 1.05
_LOG_RATIO = math.log(_RATIO)
_RATIOS = repeat(_LOG_RATIO)
"""The divisor of every value's logarithm, for ``map`` (an endless iterator, shared)."""
_POSITIVE = partial(operator.lt, 0.0)
"""``0.0 < v``: true for a positive value, false for zero, a negative one and NaN."""

STATISTICS = ("SampleCount", "Average", "Sum", "Minimum", "Maximum")
"""CloudWatch's plain statistics; any other is an extended one (``pNN.NN``)."""

_PERCENTILE = re.compile(r"p(\d{1,2}(?:\.\d{1,10})?|100)")


def is_statistic(name: str) -> bool:
    """Whether ``name`` is a statistic this module answers: a plain one or ``pNN.NN``."""
    return name in STATISTICS or percentile_of(name) is not None


def percentile_of(name: str) -> float | None:
    """The percentile ``pNN.NN`` names (0-100), or None."""
    match = _PERCENTILE.fullmatch(name)
    if match is None:
        return None
    value = float(match.group(1))
    return value if 0 <= value <= 100 else None


def _bucket(value: float) -> str:
    if value == 0:
        return "0"
    index = math.floor(math.log(abs(value)) / _LOG_RATIO)
    return f"{'-' if value < 0 else '+'}{index}"


def _middle(key: str) -> float:
    if key == "0":
        return 0.0
    sign = -1.0 if key[0] == "-" else 1.0
    return sign * math.pow(_RATIO, int(key[1:]) + 0.5)


@dataclass(slots=True)
class StatSet:
    """The values of one metric in one period; ``hist`` None when no distribution is
    kept (a set given as numbers, as PutMetricData's ``StatisticValues`` are)."""

    count: float = 0.0
    sum: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    hist: dict[str, float] | None = field(default_factory=dict)

    def observe(self, value: float, weight: float = 1.0) -> None:
        """Add ``value``, ``weight`` times."""
        self.count += weight
        self.sum += value * weight
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        if self.hist is not None:
            key = _bucket(value)
            self.hist[key] = self.hist.get(key, 0.0) + weight

    def observe_many(self, values: list[float]) -> None:
        """Add each of ``values`` once (as many ``observe`` calls, in bulk)."""
        if not values:
            return
        self.count += len(values)
        self.sum += sum(values)
        self.min = min(self.min, min(values))
        self.max = max(self.max, max(values))
        hist = self.hist
        if hist is not None:
            # Positive values (latencies, the bulk) counted by bucket index, each distinct
            # index named once. The gateway folds two values of every answer it relays,
            # so the per-value work is chained C calls (map, filter, Counter), with no
            # Python step per value: floor(log(v) / log(ratio)), as _bucket computes it.
            positive = list(filter(_POSITIVE, values))
            indexes = map(math.floor, map(operator.truediv, map(math.log, positive), _RATIOS))
            for index, n in Counter(indexes).items():
                key = f"+{index}"
                hist[key] = hist.get(key, 0.0) + n
            if len(positive) < len(values):
                # The rest as observe takes them (NaN refused there, and here).
                for key, n in Counter([_bucket(v) for v in values if not v > 0]).items():
                    hist[key] = hist.get(key, 0.0) + n

    def add(self, other: StatSet) -> None:
        """Merge ``other`` in (another gateway's, or the next part of the period)."""
        if other.count <= 0:
            return
        self.count += other.count
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        if self.hist is None or other.hist is None:
            self.hist = None
        else:
            for key, n in other.hist.items():
                self.hist[key] = self.hist.get(key, 0.0) + n

    @classmethod
    def of(cls, count: float, total: float, low: float, high: float) -> StatSet:
        """A set known only by its numbers (no distribution)."""
        return cls(count, total, low, high, None)

    def copy(self) -> StatSet:
        return StatSet(
            self.count, self.sum, self.min, self.max, None if self.hist is None else dict(self.hist)
        )

    def value(self, statistic: str) -> float | None:
        """The statistic (a name of STATISTICS or ``pNN.NN``); None when the set is empty
        or holds no distribution for a percentile."""
        if self.count <= 0:
            return None
        if statistic == "SampleCount":
            return self.count
        if statistic == "Sum":
            return self.sum
        if statistic == "Average":
            return self.sum / self.count
        if statistic == "Minimum":
            return self.min
        if statistic == "Maximum":
            return self.max
        wanted = percentile_of(statistic)
        if wanted is None:
            return None
        if self.min == self.max:
            return self.min
        if not self.hist:
            return None
        rank = wanted / 100.0 * self.count
        seen = 0.0
        for key in sorted(self.hist, key=_middle):
            seen += self.hist[key]
            if seen >= rank:
                return min(max(_middle(key), self.min), self.max)
        return self.max
