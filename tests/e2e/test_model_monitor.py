"""Model Monitor end to end with boto3: a baselining processing job of the analyzer, a
data quality job definition, a NOW schedule over an endpoint's captured records, its
execution, its violations and its CloudWatch metrics; and what is refused."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, make_tarball, unique, wait_until

ROLE = "arn:aws:iam::123456789012:role/x"
ANALYZER = "156813124566.dkr.ecr.us-east-1.amazonaws.com/sagemaker-model-monitor-analyzer"
ENV = {
    "SHIPYARD_JOB_POLL_PERIOD_S": "0.2",
    "SHIPYARD_JOB_STOP_GRACE_S": "5",
    "SHIPYARD_CAPTURE_FLUSH_INTERVAL_S": "0.2",
}

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def rows(n: int, seed: int, shift: float = 0.0) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    ages = rng.integers(18, 80, n)
    incomes = rng.normal(50 + shift, 10, n).round(2)
    return [[int(a), float(i)] for a, i in zip(ages, incomes, strict=True)]


def wait_job(sm: Any, name: str, timeout_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = sm.describe_processing_job(ProcessingJobName=name)
        if job["ProcessingJobStatus"] in ("Completed", "Failed", "Stopped"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"{name} did not end")


def baseline(gw: GatewayProcess, tmp_path: Path) -> Path:
    """Run a baselining job of the analyzer; return the folder of its results."""
    data = tmp_path / "baseline-data"
    data.mkdir()
    lines = ["label,age,income"]
    lines += [f"{a + i},{a},{i}" for a, i in rows(1000, seed=1)]
    (data / "train.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "baseline-out"
    name = unique("baseline")
    gw.sm.create_processing_job(
        ProcessingJobName=name,
        RoleArn=ROLE,
        AppSpecification={"ImageUri": ANALYZER},
        ProcessingInputs=[
            {
                "InputName": "baseline_dataset_input",
                "S3Input": {
                    "S3Uri": data.as_uri(),
                    "LocalPath": "/opt/ml/processing/input/baseline_dataset_input",
                    "S3DataType": "S3Prefix",
                    "S3InputMode": "File",
                },
            }
        ],
        ProcessingOutputConfig={
            "Outputs": [
                {
                    "OutputName": "monitoring_output",
                    "S3Output": {
                        "S3Uri": out.as_uri(),
                        "LocalPath": "/opt/ml/processing/output",
                        "S3UploadMode": "EndOfJob",
                    },
                }
            ]
        },
        ProcessingResources={
            "ClusterConfig": {
                "InstanceCount": 1,
                "InstanceType": "ml.m5.xlarge",
                "VolumeSizeInGB": 1,
            }
        },
        Environment={
            "dataset_format": json.dumps(
                {"csv": {"header": True, "output_columns_position": "START"}}
            ),
            "dataset_source": "/opt/ml/processing/input/baseline_dataset_input",
            "output_path": "/opt/ml/processing/output",
            "publish_cloudwatch_metrics": "Disabled",
        },
    )
    job = wait_job(gw.sm, name)
    assert job["ProcessingJobStatus"] == "Completed", job.get("FailureReason")
    return out


def endpoint_with_capture(gw: GatewayProcess, tmp_path: Path, capture: Path | None) -> str:
    name = unique("monitored")
    model = make_tarball("lines", tmp_path / "lines.tar.gz").as_uri()
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": model},
        ExecutionRoleArn=ROLE,
    )
    extra: dict[str, Any] = {}
    if capture is not None:
        extra["DataCaptureConfig"] = {
            "EnableCapture": True,
            "InitialSamplingPercentage": 100,
            "DestinationS3Uri": capture.as_uri(),
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        }
    gw.sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[
            {
                "VariantName": "v1",
                "ModelName": name,
                "InstanceType": "ml.m5.large",
                "InitialInstanceCount": 1,
            }
        ],
        **extra,
    )
    gw.sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    gw.sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )
    return name


def invoke_rows(gw: GatewayProcess, endpoint: str, data: list[list[float]], capture: Path) -> None:
    for age, income in data:
        gw.rt.invoke_endpoint(
            EndpointName=endpoint, ContentType="text/csv", Accept="text/csv", Body=f"{age},{income}"
        )

    def captured() -> int:
        return sum(len(p.read_text().splitlines()) for p in (capture / endpoint).rglob("*.jsonl"))

    wait_until(lambda: captured() >= len(data), "the records to be captured")


def definition_request(name: str, endpoint: str, stats: Path, out: Path) -> dict[str, Any]:
    return {
        "JobDefinitionName": name,
        "DataQualityBaselineConfig": {
            "ConstraintsResource": {"S3Uri": (stats / "constraints.json").as_uri()},
            "StatisticsResource": {"S3Uri": (stats / "statistics.json").as_uri()},
        },
        "DataQualityAppSpecification": {
            "ImageUri": ANALYZER,
            "Environment": {"publish_cloudwatch_metrics": "Enabled"},
        },
        "DataQualityJobInput": {
            "EndpointInput": {
                "EndpointName": endpoint,
                "LocalPath": "/opt/ml/processing/input/endpoint",
            }
        },
        "DataQualityJobOutputConfig": {
            "MonitoringOutputs": [
                {
                    "S3Output": {
                        "S3Uri": out.as_uri(),
                        "LocalPath": "/opt/ml/processing/output",
                        "S3UploadMode": "EndOfJob",
                    }
                }
            ]
        },
        "JobResources": {
            "ClusterConfig": {
                "InstanceCount": 1,
                "InstanceType": "ml.m5.xlarge",
                "VolumeSizeInGB": 1,
            }
        },
        "RoleArn": ROLE,
    }


def now_schedule(name: str, definition: str) -> dict[str, Any]:
    return {
        "MonitoringScheduleName": name,
        "MonitoringScheduleConfig": {
            "ScheduleConfig": {
                "ScheduleExpression": "NOW",
                "DataAnalysisStartTime": "-PT1H",
                "DataAnalysisEndTime": "PT1H",
            },
            "MonitoringJobDefinitionName": definition,
            "MonitoringType": "DataQuality",
        },
    }


def wait_execution(gw: GatewayProcess, schedule: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = gw.sm.list_monitoring_executions(MonitoringScheduleName=schedule)
        summaries = runs["MonitoringExecutionSummaries"]
        if summaries and summaries[0]["MonitoringExecutionStatus"] not in ("Pending", "InProgress"):
            return summaries[0]
        time.sleep(0.3)
    raise AssertionError(f"no ended execution of {schedule}")


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gateway_factory(extra_env=ENV)


def test_a_shifted_feature_is_reported_by_a_now_schedule_with_its_metrics(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    stats = baseline(gw, tmp_path)
    assert json.loads((stats / "constraints.json").read_text())["features"][1]["name"] == "age"
    capture, out = tmp_path / "capture", tmp_path / "monitoring"
    endpoint = endpoint_with_capture(gw, tmp_path, capture)
    invoke_rows(gw, endpoint, rows(300, seed=2, shift=30), capture)
    definition, schedule = unique("dq"), unique("schedule")
    gw.sm.create_data_quality_job_definition(**definition_request(definition, endpoint, stats, out))

    arn = gw.sm.create_monitoring_schedule(**now_schedule(schedule, definition))[
        "MonitoringScheduleArn"
    ]

    assert arn.endswith(f":monitoring-schedule/{schedule}")
    execution = wait_execution(gw, schedule)
    assert execution["MonitoringExecutionStatus"] == "CompletedWithViolations"
    assert execution["EndpointName"] == endpoint
    assert execution["MonitoringJobDefinitionName"] == definition
    job_name = execution["ProcessingJobArn"].rsplit("/", 1)[1]
    job = gw.sm.describe_processing_job(ProcessingJobName=job_name)
    assert job["MonitoringScheduleArn"] == arn
    assert job["ExitMessage"].startswith("CompletedWithViolations: Job completed successfully with")
    folder = job["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"]
    scheduled: datetime = execution["ScheduledTime"]
    assert folder == f"{out.as_uri()}/{endpoint}/{schedule}/{scheduled:%Y/%m/%d/%H}"
    results = Path(folder.removeprefix("file://"))
    violations = json.loads((results / "constraint_violations.json").read_text())["violations"]
    checks = {(v["feature_name"], v["constraint_check_type"]) for v in violations}
    assert ("income", "baseline_drift_check") in checks
    assert ("age", "baseline_drift_check") not in checks
    assert json.loads((results / "statistics.json").read_text())["dataset"]["item_count"] == 300
    described = gw.sm.describe_monitoring_schedule(MonitoringScheduleName=schedule)
    assert described["MonitoringScheduleStatus"] == "Scheduled"
    assert described["EndpointName"] == endpoint
    assert (
        described["LastMonitoringExecutionSummary"]["MonitoringExecutionStatus"]
        == "CompletedWithViolations"
    )
    assert (
        described["MonitoringScheduleConfig"]
        == now_schedule(schedule, definition)["MonitoringScheduleConfig"]
    )
    cloudwatch = gw.client("cloudwatch")
    stats_out = cloudwatch.get_metric_statistics(
        Namespace="aws/sagemaker/Endpoints/data-metrics",
        MetricName="feature_baseline_drift_income",
        Dimensions=[
            {"Name": "Endpoint", "Value": endpoint},
            {"Name": "MonitoringSchedule", "Value": schedule},
        ],
        StartTime=scheduled - timedelta(minutes=5),
        EndTime=scheduled + timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum"],
    )
    assert stats_out["Datapoints"] and stats_out["Datapoints"][0]["Maximum"] > 0.5
    status, page = gw.get(f"/console/api/monitoring-schedules/{schedule}")
    assert status == 200
    assert "CompletedWithViolations" in page.decode()
    assert "baseline_drift_check" in page.decode() and "income" in page.decode()
    status, listing = gw.get("/console/api/jobs")
    assert status == 200 and job_name in listing.decode() and schedule in listing.decode()
    status, log = gw.get(f"/console/api/processing-jobs/{job_name}/log?offset=0")
    assert status == 200 and "Processing job completed" in json.loads(log)["text"]


def test_bad_schedules_are_refused_with_aws_codes(gw: GatewayProcess, tmp_path: Path) -> None:
    stats = baseline(gw, tmp_path)
    plain = endpoint_with_capture(gw, tmp_path, capture=None)
    definition = unique("dq")
    gw.sm.create_data_quality_job_definition(
        **definition_request(definition, plain, stats, tmp_path / "out")
    )

    def refused(**request: Any) -> tuple[str, str]:
        with pytest.raises(ClientError) as caught:
            gw.sm.create_monitoring_schedule(**request)
        error = caught.value.response["Error"]
        return error["Code"], error["Message"]

    no_capture = refused(**now_schedule(unique("s"), definition))
    bad_cron = now_schedule(unique("s"), definition)
    bad_cron["MonitoringScheduleConfig"]["ScheduleConfig"] = {
        "ScheduleExpression": "cron(5 * * * *)"
    }
    far_apart = now_schedule(unique("s"), definition)
    far_apart["MonitoringScheduleConfig"]["ScheduleConfig"]["DataAnalysisStartTime"] = "-PT30H"
    unknown_definition = now_schedule(unique("s"), "no-such-definition")

    assert no_capture[0] == "ValidationException" and plain in no_capture[1]
    assert refused(**bad_cron)[0] == "ValidationException"
    assert refused(**far_apart)[0] == "ValidationException"
    assert refused(**unknown_definition)[0] == "ValidationException"
    with pytest.raises(ClientError) as unknown:
        gw.sm.describe_monitoring_schedule(MonitoringScheduleName="no-such-schedule")
    assert unknown.value.response["Error"]["Code"] == "ResourceNotFound"
    with pytest.raises(ClientError) as taken:
        gw.sm.create_data_quality_job_definition(
            **definition_request(definition, plain, stats, tmp_path / "out")
        )
    assert taken.value.response["Error"]["Code"] == "ResourceInUse"


def test_a_window_without_records_fails_with_no_data(gw: GatewayProcess, tmp_path: Path) -> None:
    stats = baseline(gw, tmp_path)
    capture = tmp_path / "capture"
    endpoint = endpoint_with_capture(gw, tmp_path, capture)
    definition, schedule = unique("dq"), unique("schedule")
    gw.sm.create_data_quality_job_definition(
        **definition_request(definition, endpoint, stats, tmp_path / "out")
    )
    request = now_schedule(schedule, definition)

    gw.sm.create_monitoring_schedule(**request)

    execution = wait_execution(gw, schedule)
    assert execution["MonitoringExecutionStatus"] == "Failed"
    assert execution["FailureReason"] == "Job inputs had no data"
    assert execution["ScheduledTime"] <= datetime.now(UTC)


def test_a_run_interrupted_by_a_restart_ends_once_as_the_same_execution(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    first = gateway_factory(extra_env=ENV)
    stats = baseline(first, tmp_path)
    capture, out = tmp_path / "capture", tmp_path / "monitoring"
    endpoint = endpoint_with_capture(first, tmp_path, capture)
    invoke_rows(first, endpoint, rows(100, seed=3), capture)
    definition, schedule = unique("dq"), unique("schedule")
    first.sm.create_data_quality_job_definition(
        **definition_request(definition, endpoint, stats, out)
    )
    first.sm.create_monitoring_schedule(**now_schedule(schedule, definition))

    def started() -> bool:
        runs = first.sm.list_monitoring_executions(MonitoringScheduleName=schedule)
        return bool(runs["MonitoringExecutionSummaries"])

    wait_until(started, "the run to start")
    assert first.stop() in (0, -15)  # uvicorn re-raises SIGTERM after a clean shutdown
    second = gateway_factory(home=first.home, extra_env=ENV)

    execution = wait_execution(second, schedule)
    assert execution["MonitoringExecutionStatus"] == "Completed"
    runs = second.sm.list_monitoring_executions(MonitoringScheduleName=schedule)
    assert len(runs["MonitoringExecutionSummaries"]) == 1
    described = second.sm.describe_monitoring_schedule(MonitoringScheduleName=schedule)
    assert described["MonitoringScheduleStatus"] == "Scheduled"


def test_a_cron_schedule_is_scheduled_stopped_started_and_deleted_across_a_restart(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    first = gateway_factory(extra_env=ENV)
    endpoint = endpoint_with_capture(first, tmp_path, tmp_path / "capture")
    definition, schedule = unique("dq"), unique("hourly")
    first.sm.create_data_quality_job_definition(
        **definition_request(definition, endpoint, tmp_path / "stats", tmp_path / "out")
    )
    request = now_schedule(schedule, definition)
    request["MonitoringScheduleConfig"]["ScheduleConfig"] = {
        "ScheduleExpression": "cron(0 * ? * * *)"
    }
    first.sm.create_monitoring_schedule(**request)

    def status(gw: GatewayProcess) -> str:
        found = gw.sm.describe_monitoring_schedule(MonitoringScheduleName=schedule)
        return str(found["MonitoringScheduleStatus"])

    wait_until(lambda: status(first) == "Scheduled", "the schedule to be Scheduled", 10)
    first.sm.stop_monitoring_schedule(MonitoringScheduleName=schedule)
    assert status(first) == "Stopped"
    assert first.stop() in (0, -15)  # uvicorn re-raises SIGTERM after a clean shutdown
    second = gateway_factory(home=first.home, extra_env=ENV)
    assert status(second) == "Stopped"
    second.sm.start_monitoring_schedule(MonitoringScheduleName=schedule)
    assert status(second) == "Scheduled"
    listed = second.sm.list_monitoring_schedules(EndpointName=endpoint)
    [summary] = listed["MonitoringScheduleSummaries"]
    assert summary["MonitoringJobDefinitionName"] == definition
    assert summary["MonitoringType"] == "DataQuality"
    with pytest.raises(ClientError) as in_use:
        second.sm.delete_data_quality_job_definition(JobDefinitionName=definition)
    assert in_use.value.response["Error"]["Code"] == "ResourceInUse"

    second.sm.delete_monitoring_schedule(MonitoringScheduleName=schedule)

    with pytest.raises(ClientError) as gone:
        second.sm.describe_monitoring_schedule(MonitoringScheduleName=schedule)
    assert gone.value.response["Error"]["Code"] == "ResourceNotFound"
    second.sm.delete_data_quality_job_definition(JobDefinitionName=definition)
    assert (
        second.sm.list_monitoring_executions(MonitoringScheduleName=schedule)[
            "MonitoringExecutionSummaries"
        ]
        == []
    )
