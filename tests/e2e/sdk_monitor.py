"""The sagemaker SDK's processors and DefaultModelMonitor, unchanged, against a gateway;
run by tests/e2e/test_sdk_monitor.py in a process of its own."""

import json
import sys
import time
from pathlib import Path

import boto3
import numpy as np
import sagemaker
from sagemaker.model_monitor import CronExpressionGenerator, DefaultModelMonitor
from sagemaker.model_monitor.dataset_format import DatasetFormat
from sagemaker.processing import ProcessingInput, ProcessingOutput, ScriptProcessor
from sagemaker.sklearn.processing import SKLearnProcessor

bucket, code_dir, model_tarball, work = sys.argv[1:5]
role = "arn:aws:iam::123456789012:role/x"
session = sagemaker.Session(
    boto_session=boto3.Session(region_name="us-east-1"), default_bucket=bucket
)
sm = session.sagemaker_client
s3 = boto3.client("s3")
rng = np.random.default_rng(1)

ages, incomes = rng.integers(18, 80, 500), rng.normal(50, 10, 500)
rows = [f"{int(a)},{i:.2f}" for a, i in zip(ages, incomes, strict=True)]
s3.put_object(Bucket=bucket, Key="raw/part-1.csv", Body="\n".join(rows).encode())

processor = SKLearnProcessor(
    framework_version="1.2-1",
    role=role,
    instance_type="ml.m5.large",
    instance_count=1,
    sagemaker_session=session,
)
processor.run(
    code=str(Path(code_dir) / "preprocess.py"),
    inputs=[
        ProcessingInput(source=f"s3://{bucket}/raw", destination="/opt/ml/processing/input/data")
    ],
    outputs=[
        ProcessingOutput(
            source="/opt/ml/processing/output/train", destination=f"s3://{bucket}/prepared"
        )
    ],
    logs=True,
)
count = s3.get_object(Bucket=bucket, Key="prepared/rows.txt")["Body"].read().decode()
print("SKLEARN", count, flush=True)

script = ScriptProcessor(
    image_uri=processor.image_uri,
    command=["python3"],
    role=role,
    instance_type="ml.m5.large",
    instance_count=1,
    sagemaker_session=session,
)
script.run(
    code=str(Path(code_dir) / "preprocess.py"),
    inputs=[
        ProcessingInput(source=f"s3://{bucket}/raw", destination="/opt/ml/processing/input/data")
    ],
    outputs=[
        ProcessingOutput(
            source="/opt/ml/processing/output/train", destination=f"s3://{bucket}/scripted"
        )
    ],
    logs=False,
)
count = s3.get_object(Bucket=bucket, Key="scripted/rows.txt")["Body"].read().decode()
print("SCRIPT", count, flush=True)

baseline_csv = Path(work) / "baseline.csv"
lines = ["label,age,income"]
lines += [f"{int(a) + float(i):.2f},{a},{i}" for a, i in (r.split(",") for r in rows)]
baseline_csv.write_text("\n".join(lines) + "\n")
monitor = DefaultModelMonitor(
    role=role, instance_count=1, instance_type="ml.m5.xlarge", sagemaker_session=session
)
monitor.suggest_baseline(
    baseline_dataset=str(baseline_csv),
    dataset_format=DatasetFormat.csv(header=True),
    output_s3_uri=f"s3://{bucket}/baseline",
    wait=True,
    logs=False,
)
constraints = monitor.latest_baselining_job.suggested_constraints()
print("BASELINE", json.dumps([f["name"] for f in constraints.body_dict["features"]]), flush=True)

sm.create_model(
    ModelName="monitored",
    PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": Path(model_tarball).as_uri()},
    ExecutionRoleArn=role,
)
sm.create_endpoint_config(
    EndpointConfigName="monitored",
    ProductionVariants=[
        {
            "VariantName": "AllTraffic",
            "ModelName": "monitored",
            "InstanceType": "ml.m5.large",
            "InitialInstanceCount": 1,
        }
    ],
    DataCaptureConfig={
        "EnableCapture": True,
        "InitialSamplingPercentage": 100,
        "DestinationS3Uri": f"s3://{bucket}/capture",
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
    },
)
sm.create_endpoint(EndpointName="monitored", EndpointConfigName="monitored")
sm.get_waiter("endpoint_in_service").wait(
    EndpointName="monitored", WaiterConfig={"Delay": 0.5, "MaxAttempts": 240}
)
runtime = session.sagemaker_runtime_client
shifted = rng.normal(90, 10, 200)
for a, i in zip(rng.integers(18, 80, 200), shifted, strict=True):
    runtime.invoke_endpoint(
        EndpointName="monitored", ContentType="text/csv", Accept="text/csv", Body=f"{a},{i:.2f}"
    )
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="capture/monitored/")
    captured = 0
    for item in listed.get("Contents", []):
        body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        captured += len(body.splitlines())
    if captured >= 200:
        break
    time.sleep(0.5)
print("CAPTURED", captured, flush=True)

monitor.create_monitoring_schedule(
    monitor_schedule_name="sdk-schedule",
    endpoint_input="monitored",
    output_s3_uri=f"s3://{bucket}/reports",
    statistics=monitor.baseline_statistics(),
    constraints=monitor.suggested_constraints(),
    schedule_cron_expression=CronExpressionGenerator.now(),
    data_analysis_start_time="-PT1H",
    data_analysis_end_time="-PT0H",
    enable_cloudwatch_metrics=True,
)
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    executions = monitor.list_executions()
    if executions:
        status = executions[-1].describe()["ProcessingJobStatus"]
        if status in ("Completed", "Failed", "Stopped"):
            break
    time.sleep(1)
# The execution ends once its metrics are published, after its processing job: wait for
# the schedule to say so rather than reading it the moment the job completed.
while time.monotonic() < deadline:
    described = sm.describe_monitoring_schedule(MonitoringScheduleName="sdk-schedule")
    summary = described.get("LastMonitoringExecutionSummary") or {}
    if summary.get("MonitoringExecutionStatus") not in (None, "Pending", "InProgress"):
        break
    time.sleep(1)
print(
    "EXECUTION",
    described["LastMonitoringExecutionSummary"]["MonitoringExecutionStatus"],
    flush=True,
)
statistics = monitor.latest_monitoring_statistics()
print("STATISTICS", statistics.body_dict["dataset"]["item_count"], flush=True)
violations = monitor.latest_monitoring_constraint_violations()
checks = sorted(
    {(v["feature_name"], v["constraint_check_type"]) for v in violations.body_dict["violations"]}
)
print("VIOLATIONS", json.dumps(checks), flush=True)
