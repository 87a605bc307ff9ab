"""The built-in Model Monitor analyzer on generated data with known answers: a baseline
from a CSV, then windows of captured records that are clean, shifted, incomplete or
carry an unseen category."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shipyard.monitoring.analyzer import AnalysisError, analyse
from shipyard.monitoring.messages import NO_DATA
from shipyard.monitoring.statistics import Kll, distance

COLUMNS = ("label", "age", "income", "colour")
COLOURS = ("red", "green", "blue")
START = datetime(2026, 5, 1, 12, tzinfo=UTC)


def rows(n: int, seed: int, *, shift: float = 0.0, missing: float = 0.0, colours=COLOURS):
    rng = np.random.default_rng(seed)
    ages = rng.integers(18, 80, n)
    incomes = rng.normal(50_000 + shift, 10_000, n)
    picked = rng.choice(colours, n)
    labels = rng.integers(0, 2, n)
    gone = rng.random(n) < missing
    for i in range(n):
        income = "" if gone[i] else f"{incomes[i]:.2f}"
        yield [str(labels[i]), str(ages[i]), income, str(picked[i])]


def baseline(tmp_path: Path, n: int = 2000) -> tuple[dict[str, Any], dict[str, Any]]:
    data = tmp_path / "baseline_dataset_input"
    data.mkdir()
    lines = [",".join(COLUMNS), *(",".join(r) for r in rows(n, seed=1))]
    (data / "train.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "baseline_out"
    env = {
        "dataset_format": json.dumps({"csv": {"header": True, "output_columns_position": "START"}}),
        "dataset_source": str(data),
        "output_path": str(out),
        "publish_cloudwatch_metrics": "Disabled",
    }
    assert analyse(env, message=tmp_path / "message", metrics=tmp_path / "m.json") == 0
    return json.loads((out / "statistics.json").read_text()), json.loads(
        (out / "constraints.json").read_text()
    )


def capture(folder: Path, records: list[list[str]], *, at: datetime = START) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, row in enumerate(records):
        stamp = (at + timedelta(seconds=i % 3000)).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = {
            "captureData": {
                "endpointInput": {
                    "observedContentType": "text/csv",
                    "mode": "INPUT",
                    "data": ",".join(row[1:]),
                    "encoding": "CSV",
                },
                "endpointOutput": {
                    "observedContentType": "text/csv",
                    "mode": "OUTPUT",
                    "data": row[0],
                    "encoding": "CSV",
                },
            },
            "eventMetadata": {"eventId": str(i), "inferenceTime": stamp},
            "eventVersion": "0",
        }
        lines.append(json.dumps(record))
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")


def monitor(
    tmp_path: Path, records: list[list[str]], *, at: datetime = START
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    stats_dir = tmp_path / "baseline_out"
    capture(
        tmp_path / "capture" / "ep" / "AllTraffic" / "2026" / "05" / "01" / "12", records, at=at
    )
    out = tmp_path / "run_out"
    env = {
        "dataset_format": json.dumps({"sagemakerCaptureJson": {"captureIndexNames": []}}),
        "dataset_source": str(tmp_path / "capture"),
        "output_path": str(out),
        "baseline_statistics": str(stats_dir / "statistics.json"),
        "baseline_constraints": str(stats_dir / "constraints.json"),
        "start_time": "2026-05-01T12:00:00Z",
        "end_time": "2026-05-01T13:00:00Z",
        "publish_cloudwatch_metrics": "Enabled",
    }
    analyse(env, message=tmp_path / "message", metrics=tmp_path / "metrics.json")
    violations = json.loads((out / "constraint_violations.json").read_text())["violations"]
    return violations, json.loads((tmp_path / "metrics.json").read_text())


def kinds(violations: list[dict[str, str]]) -> set[tuple[str, str]]:
    return {(v["feature_name"], v["constraint_check_type"]) for v in violations}


def test_a_baseline_has_aws_statistics_and_suggested_constraints(tmp_path: Path) -> None:
    stats, constraints = baseline(tmp_path)

    assert stats["dataset"]["item_count"] == 2000
    assert [f["name"] for f in stats["features"]] == list(COLUMNS)
    types = {f["name"]: f["inferred_type"] for f in stats["features"]}
    assert types == {
        "label": "Integral",
        "age": "Integral",
        "income": "Fractional",
        "colour": "String",
    }
    income = stats["features"][2]["numerical_statistics"]
    values = np.array([float(r[2]) for r in rows(2000, seed=1)])
    assert income["std_dev"] == pytest.approx(values.std())
    assert income["mean"] == pytest.approx(values.mean())
    kll = income["distribution"]["kll"]
    assert len(kll["buckets"]) == 10
    assert sum(b["count"] for b in kll["buckets"]) == 2000
    assert kll["buckets"][0]["lower_bound"] == pytest.approx(values.min())
    assert kll["sketch"]["data"] == [sorted(values.tolist())]  # exact while they fit
    by_name = {f["name"]: f for f in constraints["features"]}
    assert set(by_name["colour"]["string_constraints"]["domains"]) == set(COLOURS)
    assert by_name["income"]["completeness"] == 1.0
    assert by_name["age"]["num_constraints"] == {"is_non_negative": True}
    config = constraints["monitoring_config"]
    assert config["datatype_check_threshold"] == 1.0
    assert config["domain_content_threshold"] == 1.0
    assert config["distribution_constraints"]["comparison_threshold"] == 0.1
    assert config["distribution_constraints"]["comparison_method"] == "Robust"
    assert config["distribution_constraints"]["categorical_drift_method"] == "LInfinity"
    assert config["distribution_constraints"]["perform_comparison"] == "Enabled"


def test_a_clean_window_has_no_violation(tmp_path: Path) -> None:
    baseline(tmp_path)

    violations, metrics = monitor(tmp_path, list(rows(1000, seed=2)))

    assert violations == []
    assert set(metrics["drift"]) == set(COLUMNS)
    assert metrics["non_null"]["income"] == 1.0


def test_one_shifted_feature_reports_exactly_its_drift(tmp_path: Path) -> None:
    baseline(tmp_path)

    violations, metrics = monitor(tmp_path, list(rows(1000, seed=3, shift=15_000)))

    assert kinds(violations) == {("income", "baseline_drift_check")}
    assert violations[0]["description"].startswith("Baseline drift distance: ")
    assert violations[0]["description"].endswith(" exceeds threshold: 0.1")
    assert metrics["drift"]["income"] > 0.4


def test_a_fifth_missing_reports_completeness(tmp_path: Path) -> None:
    baseline(tmp_path)

    violations, metrics = monitor(tmp_path, list(rows(1000, seed=4, missing=0.2)))

    assert kinds(violations) == {("income", "completeness_check")}
    assert metrics["non_null"]["income"] == pytest.approx(0.8, abs=0.05)


def test_an_unseen_category_reports_categorical_values(tmp_path: Path) -> None:
    baseline(tmp_path)
    window = list(rows(1000, seed=5))
    window[7][3] = "purple"

    violations, _ = monitor(tmp_path, window)

    assert kinds(violations) == {("colour", "categorical_values_check")}


def test_a_wrong_type_and_a_missing_column_are_reported(tmp_path: Path) -> None:
    baseline(tmp_path)
    window = [r[:3] for r in rows(500, seed=6)]
    window[0][1] = "old"

    violations, _ = monitor(tmp_path, window)

    assert ("age", "data_type_check") in kinds(violations)
    assert ("colour", "missing_column_check") in kinds(violations)


def test_an_extra_column_is_reported(tmp_path: Path) -> None:
    baseline(tmp_path)

    violations, _ = monitor(tmp_path, [[*r, "1"] for r in rows(500, seed=7)])

    assert kinds(violations) == {("_c4", "extra_column_check")}


def test_records_outside_the_window_are_not_read(tmp_path: Path) -> None:
    baseline(tmp_path)

    with pytest.raises(AnalysisError, match=NO_DATA):
        monitor(tmp_path, list(rows(10, seed=8)), at=START + timedelta(hours=1, seconds=1))


def test_the_window_includes_its_ends(tmp_path: Path) -> None:
    baseline(tmp_path)

    violations, _ = monitor(tmp_path, list(rows(1, seed=8)), at=START + timedelta(hours=1))

    assert ("income", "completeness_check") not in kinds(violations)


def test_a_large_sketch_stays_within_k_and_its_distance_close_to_the_exact_one() -> None:
    rng = np.random.default_rng(9)
    a, b = rng.normal(0, 1, 100_000), rng.normal(0.3, 1, 100_000)

    sketch_a, sketch_b = Kll.of(a), Kll.of(b)

    assert sum(len(level) for level in sketch_a.levels) < 3 * 2048
    assert sketch_a.cdf(np.array([np.inf]))[0] == pytest.approx(1.0)
    exact = np.max(
        np.abs(
            np.searchsorted(np.sort(a), np.sort(np.concatenate([a, b])), side="right") / len(a)
            - np.searchsorted(np.sort(b), np.sort(np.concatenate([a, b])), side="right") / len(b)
        )
    )
    assert distance(sketch_a, sketch_b) == pytest.approx(exact, abs=0.02)
