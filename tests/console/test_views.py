"""The console's server side without a browser: escaping, log chunks, and what auth asks."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shipyard import __version__
from shipyard.errors import AccessDenied
from shipyard.gateway.console import fragments, listings, pages
from shipyard.gateway.console.captured import last_records
from shipyard.gateway.console.door import LOG_CHUNK_BYTES, _read_log, _versioned
from shipyard.gateway.console.history import MetricsHistory
from shipyard.gateway.console.logs import TAIL_BYTES, instance_tails
from shipyard.gateway.console.resources import PAGE_SIZE, Filter, page_of
from shipyard.gateway.console.state import ConsoleState, EndpointRow, JobReads, VariantRow
from shipyard.gateway.edge.auth import ANY_KEY, Caller, Door, action_of, authorize
from shipyard.records import Event, JobStatus
from shipyard.storage.events import EventState
from shipyard.storage.objects import ObjectStore

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _row(**changes: object) -> EndpointRow:
    variant = VariantRow("v1", "m", "ml.m5.large", 2, 1, 1.0, "RANDOM")
    values: dict[str, object] = {
        "name": "scores",
        "status": "InService",
        "failure_reason": None,
        "config_name": "scores-v1",
        "pending_config_name": None,
        "modified": NOW,
        "variants": (variant,),
        "is_async": False,
    }
    values.update(changes)
    return EndpointRow(**values)  # type: ignore[arg-type]


def test_text_from_users_and_processes_is_escaped() -> None:
    reason = '<img src=x onerror="alert(1)"> & more'
    html = fragments.overview([_row(status="Failed", failure_reason=reason)])
    assert "<img" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; more" in html
    assert 'data-label="Status"' in html  # cells labelled for the phone layout


def test_a_page_is_a_shell_that_names_its_views() -> None:
    html = pages.shell(
        title='<b>"x"</b>', active="Endpoints", body=pages.endpoint("a b"), auth=True, region="eu"
    )
    assert "<title>&lt;b&gt;&quot;x&quot;&lt;/b&gt; · shipyard</title>" in html
    assert 'data-view="/console/api/endpoints/a%20b"' in html
    assert 'data-metrics="/console/api/endpoints/a%20b/metrics"' in html
    assert 'data-auth="1" data-region="eu"' in html
    assert "<script>" not in html  # no inline script: the CSP allows none
    assert '<script type="module" src="/console/static/console.js?v=' in html


def test_the_scripts_import_each_other_at_this_version() -> None:
    answer = _versioned(b'import { a } from "./signing.js";\nfrom "./polling.js";')
    assert (
        answer
        == (
            f'import {{ a }} from "./signing.js?v={__version__}";\n'
            f'from "./polling.js?v={__version__}";'
        ).encode()
    )


def test_a_log_is_read_in_whole_lines_from_an_offset_or_its_tail(tmp_path: Path) -> None:
    first, second = tmp_path / "1.log", tmp_path / "2.log"
    first.write_text("one\ntwo\n")
    second.write_text("three\nfour-unfinished")
    files = [first, second, tmp_path / "missing.log"]
    text, offset = _read_log(files, 0, False)
    assert (text, offset) == ("one\ntwo\nthree\n", 14)  # the unfinished line waits
    assert _read_log(files, offset, False) == ("", 14)
    assert _read_log(files, offset, True) == ("four-unfinished", 29)  # the job has ended
    big = tmp_path / "big.log"
    big.write_text("".join(f"line {n}\n" for n in range(20_000)))
    tail, end = _read_log([big], None, False)
    assert end == big.stat().st_size and tail.endswith("line 19999\n")
    assert len(tail) <= LOG_CHUNK_BYTES and tail.startswith("line ")  # from a line start


def test_pages_load_unsigned_and_each_view_is_scoped_as_what_it_reads() -> None:
    for path in ("/console", "/console/", "/console/jobs/x", "/console/static/console.js"):
        assert action_of("GET", path, None) is None
    assert action_of("POST", "/console", None) is not None
    expected = {
        "/console/api/endpoints": "sagemaker:DescribeEndpoint",
        "/console/api/endpoints/x": "sagemaker:DescribeEndpoint",
        "/console/api/endpoints/x/metrics": "shipyard:GetMetrics",
        "/console/api/endpoints/x/logs": "logs:GetLogEvents",
        "/console/api/transform-jobs/x/logs": "logs:GetLogEvents",
        "/console/api/jobs/x/log": "sagemaker:DescribeTrainingJob",
        "/console/api/transform-jobs/x": "sagemaker:DescribeTransformJob",
        "/console/api/events": "shipyard:GetEvents",
        "/console/api/other": "shipyard:Unknown",
        # resources named like a view are described, as any other
        "/console/api/endpoints/logs": "sagemaker:DescribeEndpoint",
        "/console/api/endpoints/metrics": "sagemaker:DescribeEndpoint",
        "/console/api/transform-jobs/logs": "sagemaker:DescribeTransformJob",
        "/console/api/endpoints/captured": "sagemaker:DescribeEndpoint",
        # the other resources, each as its Describe; captured bodies need more
        "/console/api/endpoints/x/history": "sagemaker:DescribeEndpoint",
        "/console/api/endpoints/x/requests": "sagemaker:DescribeEndpoint",
        "/console/api/endpoints/x/captured": "shipyard:GetCapturedData",
        "/console/api/models": "sagemaker:DescribeModel",
        "/console/api/models/x": "sagemaker:DescribeModel",
        "/console/api/endpoint-configs/x": "sagemaker:DescribeEndpointConfig",
        "/console/api/inference-components/x": "sagemaker:DescribeInferenceComponent",
        "/console/api/alarms/x": "cloudwatch:DescribeAlarms",
        "/console/api/whoami": "shipyard:GetCallerPermissions",
    }
    for path, action in expected.items():
        assert action_of("GET", path, None) == (Door.OTHER, action)


def test_the_history_keeps_the_last_readings_of_endpoints_that_still_exist() -> None:
    now = [100.0]
    current = {"a": {"v1": {"invocations": 1.0}}, "b": {"v1": {"invocations": 5.0}}}
    history = MetricsHistory(lambda: current, keep=2, clock=lambda: now[0])
    for n in range(3):
        now[0] = 100.0 + 5 * n
        current["a"]["v1"] = {"invocations": float(n)}
        history.sample()
    assert [r["t"] for r in history.readings("a")] == [105.0, 110.0]
    assert history.readings("a")[-1]["variants"] == {"v1": {"invocations": 2.0}}
    del current["b"]
    history.sample()
    assert history.readings("b") == [] and history.readings("nope") == []


def test_instance_logs_are_the_ends_of_each_instances_file(tmp_path: Path) -> None:
    folder = tmp_path / "scores"
    folder.mkdir()
    (folder / "scores-v1-1.log").write_text("".join(f"line {n}\n" for n in range(5000)))
    (folder / "scores-v1-2.log").write_text("serving\n")
    tails = dict(instance_tails(tmp_path, "scores"))
    assert tails["scores-v1-2"] == "serving\n"
    long = tails["scores-v1-1"]
    assert long.endswith("line 4999\n") and long.startswith("line ") and len(long) <= TAIL_BYTES
    assert instance_tails(tmp_path, "..") == instance_tails(tmp_path, "nope") == []


def test_a_key_scoped_by_resource_lists_only_the_jobs_and_events_it_reaches() -> None:
    def arn(kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:eu:1:{kind}/{name}"

    def job(name: str, status: JobStatus) -> Any:
        return SimpleNamespace(name=name, arn=arn("training-job", name), status=status)

    jobs = [
        job("b-1", JobStatus.FAILED),
        job("a-1", JobStatus.COMPLETED),
        job("b-2", JobStatus.FAILED),
    ]

    def event(resource: str, **detail: str) -> EventState:
        source = "aws.application-autoscaling" if "ResourceId" in detail else "aws.sagemaker"
        made = Event("k", "t", source, resource, dict(detail), (), "s", "m", NOW)
        return EventState(made, 0, NOW, None, NOW)

    events = [
        event(arn("training-job", "a-1")),
        event(arn("training-job", "b-1")),
        # A scaling activity is about the endpoint it scales, not its scalable target.
        event(
            "arn:aws:application-autoscaling:eu:1:scalable-target/f0",
            ResourceId="endpoint/a-e/variant/v",
        ),
        event(
            "arn:aws:application-autoscaling:eu:1:scalable-target/f1",
            ResourceId="endpoint/b-e/variant/v",
        ),
    ]
    state = ConsoleState(
        endpoints=SimpleNamespace(arn=arn),  # type: ignore[arg-type]
        fleets={},
        routes={},
        backlogs={},
        metrics=None,  # type: ignore[arg-type]
        jobs=JobReads(
            newest_jobs=lambda n: (jobs[:n], {"Failed": 2, "Completed": 1}),
            describe_job=lambda name: jobs[0],
            newest_transforms=lambda n: ([], {}),
            describe_transform=lambda name: jobs[0],
        ),
        events=SimpleNamespace(recent_events=lambda n: events[:n]),  # type: ignore[arg-type]
    )

    def reaches(resource: str) -> bool:
        return resource.rsplit("/", 1)[-1].startswith("a-") or "endpoint/a-" in resource

    listing = state.jobs(reaches)
    assert [j.name for j in listing.jobs] == ["a-1"]
    assert (listing.total, listing.by_status) == (1, {"Completed": 1})  # not the others'
    assert state.jobs().total == 3
    shown = [s.event for s in state.recent_events(10, reaches)]
    assert [e.resource.rsplit("/", 1)[-1] for e in shown] == ["a-1", "f0"]
    assert len(state.recent_events(10)) == 4
    # Filters, as ListTrainingJobs takes them, and events by the resource they name.
    failed = state.jobs(None, name="B-", status="Failed")
    assert [j.name for j in failed.jobs] == ["b-1", "b-2"] and failed.total == 2
    assert [j.name for j in state.jobs(reaches, name="b").jobs] == []
    about = state.recent_events(10, None, "a-1")
    assert [s.event.resource for s in about] == [arn("training-job", "a-1")]


def test_every_key_may_ask_what_it_may_do_and_nothing_more() -> None:
    reader = Caller("AKIA", allow=("sagemaker:describe*",))
    authorize(reader, ANY_KEY, account_id="1")  # allowed by no pattern, still answered
    with pytest.raises(AccessDenied):
        authorize(reader, "sagemaker:DeleteEndpoint", account_id="1")


def test_lists_filter_by_name_and_status_and_page_like_list_actions() -> None:
    items = [
        SimpleNamespace(
            name=f"m-{n:03d}",
            status="InService" if n % 2 else "Failed",
            image="i",
            model_data_url=None,
            created=NOW.replace(minute=n % 60, second=n // 60),
        )
        for n in range(120)
    ]
    first = page_of(items, Filter(), name=lambda m: m.name, created=lambda m: m.created)
    assert first.total == 120 and len(first.items) == PAGE_SIZE and first.more
    html = listings.models(first)  # type: ignore[arg-type]
    assert 'data-page="1">Next page' in html and "Previous page" not in html
    failed = page_of(
        items,
        Filter(name="M-01", status="Failed", page=0),
        name=lambda m: m.name,
        status=lambda m: m.status,
        created=lambda m: m.created,
    )
    assert {m.name for m in failed.items} == {f"m-01{n}" for n in range(0, 10, 2)}
    assert Filter.of({"page": "-1", "name": "x" * 100}) == Filter(name="x" * 63)


def test_captured_records_read_newest_first_text_as_text_binary_as_its_size(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "capture" / "ep" / "AllTraffic" / "2026" / "11" / "29" / "12"
    folder.mkdir(parents=True)

    def record(at: str, data: str, encoding: str = "JSON") -> str:
        body = {"observedContentType": "application/json", "mode": "INPUT", "data": data,
                "encoding": encoding}  # fmt: skip
        meta = {"eventId": "e", "inferenceId": at, "inferenceTime": f"2026-11-29T12:{at}Z"}
        return json.dumps({"captureData": {"endpointInput": body}, "eventMetadata": meta})

    (folder / "00-00-000-a.jsonl").write_text(record("00:01", "[[1, 2]]") + "\n")
    binary = base64.b64encode(b"\xff\x00\x01").decode()
    (folder / "01-00-000-b.jsonl").write_text(
        record("01:01", binary, "BASE64") + "\nnot json\n" + record("01:02", "[[3]]") + "\n"
    )
    shown = last_records(ObjectStore(), (tmp_path / "capture").as_uri(), "ep")
    assert [r.inference_id for r in shown.records] == ["01:02", "01:01", "00:01"]
    assert shown.records[0].input is not None and shown.records[0].input.text == "[[3]]"
    binary_body = shown.records[1].input
    assert binary_body is not None and binary_body.text is None and binary_body.size == 3
    assert shown.records[2].variant == "AllTraffic" and shown.records[0].output is None
    html = listings.captured(shown)
    assert "[[3]]" in html and "3 bytes" in html and "(binary)" in html
    assert last_records(ObjectStore(), (tmp_path / "none").as_uri(), "ep").records == ()


def test_a_schedules_page_lists_its_runs_and_their_violations_escaped() -> None:
    schedule = SimpleNamespace(
        name="s",
        status="Scheduled",
        failure_reason=None,
        request={"MonitoringScheduleConfig": {"ScheduleConfig": {"ScheduleExpression": "NOW"}}},
        next_tick=None,
        created=NOW,
    )
    run = SimpleNamespace(
        execution=SimpleNamespace(
            scheduled=NOW,
            status="CompletedWithViolations",
            window_start=NOW,
            window_end=NOW,
            job_name="model-monitoring-1",
            detail={"request": {"ProcessingJobName": "model-monitoring-1"}},
            failure_reason=None,
        ),
        violations=[
            {
                "feature_name": "<b>income</b>",
                "constraint_check_type": "baseline_drift_check",
                "description": "Baseline drift distance: 0.5 exceeds threshold: 0.1",
            }
        ],
    )
    view = SimpleNamespace(schedule=schedule, endpoint="scores", runs=[run])

    html = fragments.monitoring_schedule(view)

    assert "&lt;b&gt;income&lt;/b&gt;" in html and "<b>income" not in html
    assert "baseline_drift_check" in html
    assert 'href="/console/processing-jobs/model-monitoring-1"' in html
    assert 'href="/console/endpoints/scores"' in html
