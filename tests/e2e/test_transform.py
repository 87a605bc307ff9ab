"""Batch transform end to end: real gateways, instances and files, driven
with boto3 as SageMaker users drive it."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import signal
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.exceptions
import psutil
import pytest
import yaml

from shipyard.transform.splitting import masked_crc32c
from tests.conftest import MODELS, Bucket, GatewayProcess, deploy, make_tarball, unique, wait_until
from tests.e2e.processes import instance_pids

ROLE = "arn:aws:iam::123456789012:role/x"


def create_model(gw: GatewayProcess, name: str, model: str, tmp_path: Path) -> None:
    tarball = make_tarball(model, tmp_path / "artifacts" / f"{name}.tar.gz")
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={"Image": "shipyard/python", "ModelDataUrl": tarball.as_uri()},
        ExecutionRoleArn=ROLE,
    )


def transform(
    gw: GatewayProcess,
    name: str,
    model: str,
    source: str,
    output: Path | str,
    *,
    count: int = 1,
    data_type: str = "S3Prefix",
    **extra: Any,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "TransformJobName": name,
        "ModelName": model,
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": data_type, "S3Uri": source}},
            "ContentType": "text/csv",
            "SplitType": "Line",
        },
        "TransformOutput": {
            "S3OutputPath": output if isinstance(output, str) else output.as_uri(),
            "AssembleWith": "Line",
        },
        "TransformResources": {"InstanceType": "ml.m5.large", "InstanceCount": count},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(request.get(key), dict):
            request[key] = {**request[key], **value}
        else:
            request[key] = value
    gw.sm.create_transform_job(**request)
    return request


def wait_done(gw: GatewayProcess, name: str) -> dict[str, Any]:
    """boto3's waiter until the job ends (it raises on Failed, which some tests expect)."""
    try:
        gw.sm.get_waiter("transform_job_completed_or_stopped").wait(
            TransformJobName=name, WaiterConfig={"Delay": 0.3, "MaxAttempts": 400}
        )
    except botocore.exceptions.WaiterError as exc:
        assert exc.last_response["TransformJobStatus"] == "Failed", exc
    job: dict[str, Any] = gw.sm.describe_transform_job(TransformJobName=name)
    return job


def metric(gw: GatewayProcess, series: str) -> float | None:
    status, body = gw.get("/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def write_csv(folder: Path, name: str, rows: list[list[float]]) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(",".join(str(v) for v in row) + "\n" for row in rows))
    return path


@pytest.fixture
def gw(gateway_factory: Callable[..., GatewayProcess]) -> GatewayProcess:
    return gateway_factory()


def test_lines_are_scored_in_order_by_two_instances_and_the_job_completes(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in"
    big = [[i, 1] for i in range(3000)]
    write_csv(data, "a.csv", big)
    write_csv(data, "sub/b.csv", [[1, 2, 3], [4, 5, 6]])
    name = unique("tf")
    transform(gw, name, "lines", data.as_uri(), tmp_path / "out", count=2,
              BatchStrategy="MultiRecord", MaxPayloadInMB=1, MaxConcurrentTransforms=2,
              TransformOutput={"Accept": "text/csv"})  # fmt: skip
    first = gw.sm.describe_transform_job(TransformJobName=name)
    assert first["TransformJobStatus"] == "InProgress"
    assert first["TransformResources"]["InstanceCount"] == 2
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    assert job["TransformEndTime"] >= job["TransformStartTime"] >= job["CreationTime"]
    assert job["BatchStrategy"] == "MultiRecord" and job["MaxPayloadInMB"] == 1
    answers = (tmp_path / "out" / "a.csv.out").read_text().splitlines()
    assert answers == [str(float(i + 1)) for i in range(3000)]
    assert (tmp_path / "out" / "sub" / "b.csv.out").read_text() == "6.0\n15.0\n"
    assert metric(gw, f'shipyard_transform_objects{{job="{name}",state="done"}}') == 2
    assert metric(gw, f'shipyard_transform_records_done{{job="{name}"}}') == 3002
    wait_until(lambda: instance_pids(gw.process.pid) == [], "the job's instances stopped")

    listed = gw.sm.list_transform_jobs(NameContains=name, StatusEquals="Completed")
    assert [j["TransformJobName"] for j in listed["TransformJobSummaries"]] == [name]


def test_gzip_single_records_with_filters_and_join(gw: GatewayProcess, tmp_path: Path) -> None:
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in"
    data.mkdir()
    rows = [{"id": i, "x": [i, i]} for i in range(5)]
    with gzip.open(data / "rows.jsonl.gz", "wt") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    name = unique("tfjoin")
    transform(
        gw, name, "lines", data.as_uri(), tmp_path / "out",
        TransformInput={"ContentType": "application/jsonlines", "CompressionType": "Gzip"},
        TransformOutput={"Accept": "application/jsonlines"},
        BatchStrategy="SingleRecord",
        DataProcessing={"InputFilter": "$", "JoinSource": "Input",
                        "OutputFilter": "$['id','SageMakerOutput']"},
    )  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    lines = (tmp_path / "out" / "rows.jsonl.gz.out").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"id": i, "SageMakerOutput": {"sum": 2 * i}} for i in range(5)
    ]


def test_each_object_whole_and_a_manifest(gw: GatewayProcess, tmp_path: Path) -> None:
    create_model(gw, "echo", "echo", tmp_path)
    data = tmp_path / "in"
    data.mkdir()
    for i in range(3):
        (data / f"{i}.json").write_text(json.dumps({"n": i}))
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps([{"prefix": data.as_uri() + "/"}, "0.json", "2.json"]))
    name = unique("tfman")
    transform(gw, name, "echo", manifest.as_uri(), tmp_path / "out", data_type="ManifestFile",
              TransformInput={"ContentType": "application/json", "SplitType": "None"},
              TransformOutput={"AssembleWith": "None", "Accept": "application/json"})  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    produced = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert produced == ["0.json.out", "2.json.out"]
    assert json.loads((tmp_path / "out" / "2.json.out").read_text()) == {"n": 2}


def test_object_names_are_names_under_the_output_path(gw: GatewayProcess, tmp_path: Path) -> None:
    # '%2F' read as '/' and '#' as a fragment's start once wrote outputs outside the
    # output path, and two objects into one; a manifest's '..' reached other files.
    create_model(gw, "echo", "echo", tmp_path)
    data = tmp_path / "in"
    data.mkdir()
    names = ["r#1.json", "r#2.json", "..%2F..%2Fescaped.json#", "50% off.json"]
    for i, name in enumerate(names):
        (data / name).write_text(json.dumps({"n": i}))
    out = tmp_path / "a" / "out"
    name = unique("tfnames")
    transform(gw, name, "echo", data.as_uri(), out,
              TransformInput={"ContentType": "application/json", "SplitType": "None"},
              TransformOutput={"AssembleWith": "None", "Accept": "application/json"})  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    assert sorted(p.name for p in (tmp_path / "a").rglob("*")) == sorted(
        ["out"] + [f"{n}.out" for n in names]
    )
    for i, n in enumerate(names):
        assert json.loads((out / f"{n}.out").read_text()) == {"n": i}
    # Its instances' logs are the job's, apart from any endpoint's of the same name.
    with urllib.request.urlopen(f"{gw.url}/console/api/transform-jobs/{name}/logs") as r:
        assert f"{name}-".encode() in r.read()
    with urllib.request.urlopen(f"{gw.url}/console/api/endpoints/{name}/logs") as r:
        assert f"{name}-".encode() not in r.read()

    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps([{"prefix": data.as_uri() + "/"}, "r#1.json", "../victim.json"]))
    name = unique("tfdots")
    transform(gw, name, "echo", manifest.as_uri(), tmp_path / "out2", data_type="ManifestFile",
              TransformInput={"ContentType": "application/json", "SplitType": "None"},
              TransformOutput={"AssembleWith": "None", "Accept": "application/json"})  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Failed"
    assert "ClientError" in job["FailureReason"] and "would leave it" in job["FailureReason"]
    assert victim.read_text() == "precious" and not (tmp_path / "out2").exists()


def test_a_failing_record_fails_the_job_naming_it_and_writes_nothing(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in"
    (data).mkdir()
    (data / "bad.csv").write_text("1,2\n3,4\nboom\n5,6\n")
    name = unique("tffail")
    transform(gw, name, "lines", data.as_uri(), tmp_path / "out",
              ModelClientConfig={"InvocationsMaxRetries": 1})  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Failed"
    reason = job["FailureReason"]
    assert "bad.csv" in reason and "record 3" in reason, reason
    assert not (tmp_path / "out" / "bad.csv.out").exists()
    wait_until(lambda: instance_pids(gw.process.pid) == [], "the job's instances stopped")


def test_stop_ends_the_job_stopped_with_its_instances_gone(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    create_model(gw, "sleepy", "sleepy", tmp_path)
    data = tmp_path / "in"
    data.mkdir()
    (data / "slow.jsonl").write_text('{"sleep": 0.5}\n' * 200)
    name = unique("tfstop")
    transform(gw, name, "sleepy", data.as_uri(), tmp_path / "out",
              TransformInput={"ContentType": "application/json"})  # fmt: skip
    wait_until(lambda: instance_pids(gw.process.pid) != [], "the job's instance up")
    gw.sm.stop_transform_job(TransformJobName=name)
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Stopped"
    wait_until(lambda: instance_pids(gw.process.pid) == [], "the job's instances stopped")
    assert not (tmp_path / "out" / "slow.jsonl.out").exists()


def test_a_restart_resumes_the_job_without_redoing_finished_objects(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    gw = gateway_factory(home=home)
    create_model(gw, "sleepy", "sleepy", tmp_path)
    data = tmp_path / "in"
    data.mkdir()
    for i in range(6):
        (data / f"{i}.jsonl").write_text('{"sleep": 0.2}\n' * 3)
    out = tmp_path / "out"
    name = unique("tfresume")
    transform(gw, name, "sleepy", data.as_uri(), out,
              TransformInput={"ContentType": "application/json"})  # fmt: skip
    # With one payload in flight (one instance, MaxConcurrentTransforms 1) objects end in
    # order, each recorded finished just after its output is in place: an output seen
    # before its record (the kill may fall between) is rightly redone.
    done = f'shipyard_transform_objects{{job="{name}",state="done"}}'
    wait_until(lambda: (metric(gw, done) or 0) >= 2, "two objects finished", 60)
    finished = int(metric(gw, done) or 0)
    written = {
        f"{i}.jsonl.out": (out / f"{i}.jsonl.out").stat().st_mtime_ns for i in range(finished)
    }
    gw.stop(signal.SIGKILL)
    gw = gateway_factory(home=home)
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    assert sorted(p.name for p in out.iterdir()) == [f"{i}.jsonl.out" for i in range(6)]
    for file, stamp in written.items():
        assert (out / file).stat().st_mtime_ns == stamp, f"{file} was written again"


def test_bad_requests_are_refused(gw: GatewayProcess, tmp_path: Path) -> None:
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in"
    write_csv(data, "a.csv", [[1]])
    name = unique("tfbad")
    transform(gw, name, "lines", data.as_uri(), tmp_path / "out")

    def refused(call: Callable[[], object], code: str, words: str) -> None:
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            call()
        error = caught.value.response["Error"]
        assert error["Code"] == code and words in error["Message"], error

    refused(lambda: transform(gw, name, "lines", data.as_uri(), tmp_path / "o2"),
            "ResourceInUse", "already exists")  # fmt: skip
    refused(lambda: transform(gw, unique("tf"), "nope", data.as_uri(), tmp_path / "o2"),
            "ValidationException", "Could not find model")  # fmt: skip
    refused(
        lambda: transform(gw, unique("tf"), "lines", data.as_uri(), tmp_path / "o2",
                          DataProcessing={"InputFilter": "$..a[?(@.b)]"}),
        "ValidationException", "InputFilter",
    )  # fmt: skip
    refused(lambda: gw.sm.describe_transform_job(TransformJobName="nope"),
            "ValidationException", "Could not find requested job")  # fmt: skip
    # SageMaker's bounds on the payloads: one, and those in flight to an instance.
    refused(lambda: transform(gw, unique("tf"), "lines", data.as_uri(), tmp_path / "o2",
                              MaxPayloadInMB=101),
            "ValidationException", "MaxPayloadInMB 101 is more than the maximum")  # fmt: skip
    refused(lambda: transform(gw, unique("tf"), "lines", data.as_uri(), tmp_path / "o2",
                              MaxConcurrentTransforms=17, MaxPayloadInMB=6),
            "ValidationException", "MaxConcurrentTransforms 17 x MaxPayloadInMB 6")  # fmt: skip
    wait_done(gw, name)
    refused(lambda: gw.sm.stop_transform_job(TransformJobName=name),
            "ValidationException", "Completed")  # fmt: skip


def test_a_direct_model_is_refused(gw: GatewayProcess, tmp_path: Path) -> None:
    """A transform never names a target container, so every record of a Direct model
    would fail: CreateTransformJob refuses it, naming the model and why."""
    stage = (MODELS / "stage").as_uri()
    gw.sm.create_model(
        ModelName="direct",
        Containers=[
            {"Image": "shipyard/python", "ModelDataUrl": stage, "ContainerHostname": host}
            for host in ("ha", "hb")
        ],
        InferenceExecutionConfig={"Mode": "Direct"},
        ExecutionRoleArn=ROLE,
    )
    data = tmp_path / "in"
    write_csv(data, "a.csv", [[1]])
    name = unique("tfdirect")
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        transform(gw, name, "direct", data.as_uri(), tmp_path / "out")
    error = caught.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    assert "Model direct" in error["Message"] and "Direct" in error["Message"], error
    with pytest.raises(botocore.exceptions.ClientError):
        gw.sm.describe_transform_job(TransformJobName=name)


def test_transform_instances_count_against_the_gateways_instance_quota(
    gateway_factory: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """SHIPYARD_MAX_INSTANCES is the instances of endpoints and transform jobs together:
    past it, or past a job's own limit, CreateTransformJob is ResourceLimitExceeded."""
    gw = gateway_factory(extra_env={"SHIPYARD_MAX_INSTANCES": "2"})
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in"
    write_csv(data, "a.csv", [[1]])

    def refused(count: int, words: str) -> None:
        with pytest.raises(botocore.exceptions.ClientError) as caught:
            transform(gw, unique("tfq"), "lines", data.as_uri(), tmp_path / "o", count=count)
        error = caught.value.response["Error"]
        assert error["Code"] == "ResourceLimitExceeded" and words in error["Message"], error

    refused(50, "instances per job")
    refused(3, "SHIPYARD_MAX_INSTANCES")
    deploy(gw.sm, "held", make_tarball("echo", tmp_path / "echo.tar.gz").as_uri(), count=2)
    refused(1, "SHIPYARD_MAX_INSTANCES")  # the endpoint holds both
    gw.sm.delete_endpoint(EndpointName="held")
    name = unique("tfq")
    transform(gw, name, "lines", data.as_uri(), tmp_path / "out", count=2)
    assert wait_done(gw, name)["TransformJobStatus"] == "Completed"


def recordio(records: list[bytes]) -> bytes:
    out = b""
    for data in records:
        out += struct.pack("<II", 0xCED7230A, len(data)) + data + b"\0" * (-len(data) % 4)
    return out


def tfrecord(records: list[bytes]) -> bytes:
    out = b""
    for data in records:
        length = struct.pack("<Q", len(data))
        out += length + struct.pack("<I", masked_crc32c(length))
        out += data + struct.pack("<I", masked_crc32c(data))
    return out


@pytest.mark.parametrize(
    ("split", "content_type", "frame", "overhead"),
    [
        ("RecordIO", "application/x-recordio", recordio, 8),
        ("TFRecord", "application/x-tfrecord", tfrecord, 16),
    ],
)
def test_binary_records_are_sent_one_at_a_time_with_their_framing(
    gw: GatewayProcess,
    tmp_path: Path,
    split: str,
    content_type: str,
    frame: Callable[[list[bytes]], bytes],
    overhead: int,
) -> None:
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in"
    data.mkdir()
    sizes = [1, 5, 8, 300, 0, 13]
    (data / "records.bin").write_bytes(frame([b"x" * n for n in sizes]))
    name = unique("tfbin")
    transform(gw, name, "lines", data.as_uri(), tmp_path / "out",
              TransformInput={"ContentType": content_type, "SplitType": split},
              BatchStrategy="SingleRecord", MaxConcurrentTransforms=2)  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    answers = (tmp_path / "out" / "records.bin.out").read_text().splitlines()
    assert answers == [str(n + overhead) for n in sizes]


def test_answers_keep_input_order_whichever_instance_is_faster(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    create_model(gw, "sleepy", "sleepy", tmp_path)
    data = tmp_path / "in"
    data.mkdir()
    rng = random.Random(7)
    sleeps = [round(rng.uniform(0, 0.03), 4) for _ in range(80)]
    (data / "jitter.jsonl").write_text("".join(json.dumps({"sleep": s}) + "\n" for s in sleeps))
    name = unique("tforder")
    transform(gw, name, "sleepy", data.as_uri(), tmp_path / "out", count=2,
              TransformInput={"ContentType": "application/json"},
              BatchStrategy="SingleRecord", MaxConcurrentTransforms=2)  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    answers = [
        json.loads(x) for x in (tmp_path / "out" / "jitter.jsonl.out").read_text().splitlines()
    ]
    assert [a["slept"] for a in answers] == sleeps
    assert len({a["pid"] for a in answers}) == 2, "both instances served"


def test_small_objects_are_scored_side_by_side_up_to_the_concurrency(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    # One request per object (SplitType None): with MaxConcurrentTransforms 2 and two
    # handler threads, two objects' requests meet in the model (runtime "rendezvous"
    # model: "met" when two run at once, "alone" after waiting 1 s for another). Objects
    # sent one after the other would all be "alone".
    tarball = make_tarball("rendezvous", tmp_path / "artifacts" / "rendezvous.tar.gz")
    gw.sm.create_model(
        ModelName="rendezvous",
        PrimaryContainer={
            "Image": "shipyard/python",
            "ModelDataUrl": tarball.as_uri(),
            "Environment": {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"},
        },
        ExecutionRoleArn=ROLE,
    )
    data = tmp_path / "in"
    data.mkdir()
    for i in range(6):
        (data / f"{i}.json").write_text(json.dumps({"n": i}))
    name = unique("tfside")
    transform(gw, name, "rendezvous", data.as_uri(), tmp_path / "out",
              TransformInput={"ContentType": "application/json", "SplitType": "None"},
              TransformOutput={"AssembleWith": "None"}, MaxConcurrentTransforms=2)  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    answers = {p.name: json.loads(p.read_text()) for p in (tmp_path / "out").iterdir()}
    assert answers == {f"{i}.json.out": "met" for i in range(6)}
    done = f'shipyard_transform_objects{{job="{name}",state="done"}}'
    assert metric(gw, done) == 6


def test_objects_on_s3_and_the_end_announced(
    gateway_factory: Callable[..., GatewayProcess],
    bucket: Bucket,
    tmp_path: Path,
    webhook: Any,
) -> None:
    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({
        "topics": {"done": [webhook.url]},
        "jobs": {"notify": {"Completed": ["done"], "Failed": ["done"]}},
    }))  # fmt: skip
    gw = gateway_factory(
        extra_env={"SHIPYARD_S3_ENDPOINT_URL": bucket.endpoint_url},
        args=["--config", str(stack)],
    )
    create_model(gw, "lines", "lines", tmp_path)
    bucket.put("in/part-1.csv", b"1,2\n3,4\n")
    bucket.put("in/deep/part-2.csv", b"5,6\n")
    bucket.put("input-elsewhere.csv", b"7,8\n")
    name = unique("tfs3")
    transform(gw, name, "lines", f"s3://{bucket.name}/in/", f"s3://{bucket.name}/out")
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    read = bucket.client.get_object
    assert read(Bucket=bucket.name, Key="out/part-1.csv.out")["Body"].read() == b"3.0\n7.0\n"
    keys = {o["Key"] for o in bucket.client.list_objects_v2(Bucket=bucket.name)["Contents"]}
    assert "out/deep/part-2.csv.out" in keys and "out/input-elsewhere.csv.out" not in keys
    wait_until(lambda: any(name in str(r.body) for r in webhook.requests), "the announcement")
    (message,) = [r.body for r in webhook.requests if name in str(r.body)]
    assert "Completed" in message["title"] and "Objects: 2 of 2" in message["message"]


def shipyard(gw: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SHIPYARD_URL": gw.url, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "shipyard", *args], capture_output=True,
                          text=True, env=env, timeout=60)  # fmt: skip


def test_the_cli_lists_describes_watches_and_stops(gw: GatewayProcess, tmp_path: Path) -> None:
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in"
    for i in range(3):
        write_csv(data, f"{i}.csv", [[i, 1]] * 10)
    name = unique("tfcli")
    transform(gw, name, "lines", data.as_uri(), tmp_path / "out")
    watched = shipyard(gw, "transform", "watch", name)
    assert watched.returncode == 0, watched.stderr
    assert "3/3" in watched.stdout and "30 records" in watched.stdout
    listed = shipyard(gw, "transform", "list")
    assert name in listed.stdout and "Completed" in listed.stdout and "3/3" in listed.stdout
    described = shipyard(gw, "transform", "describe", name)
    assert "Records" in described.stdout and "30" in described.stdout
    as_json = json.loads(shipyard(gw, "transform", "describe", name, "--json").stdout)
    assert as_json["TransformJobStatus"] == "Completed"
    missing = shipyard(gw, "transform", "describe", "nope")
    assert missing.returncode == 1 and "Could not find requested job" in missing.stderr

    create_model(gw, "sleepy", "sleepy", tmp_path)
    (data / "slow.jsonl").write_text('{"sleep": 0.5}\n' * 100)
    slow = unique("tfcli")
    transform(gw, slow, "sleepy", (data / "slow.jsonl").as_uri(), tmp_path / "out2",
              TransformInput={"ContentType": "application/json"})  # fmt: skip
    stopped = shipyard(gw, "transform", "stop", slow)
    assert stopped.returncode == 0, stopped.stderr
    watched = shipyard(gw, "transform", "watch", slow)
    assert watched.returncode == 1 and "was stopped" in watched.stderr


def test_execution_parameters_fill_in_what_the_request_leaves_out(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    server = MODELS / "batch_server" / "server.py"
    gw.sm.create_model(
        ModelName="batch-server",
        PrimaryContainer={"Image": f"cmd:{sys.executable} {server}"},
        ExecutionRoleArn=ROLE,
    )
    data = tmp_path / "in"
    write_csv(data, "a.csv", [[i] for i in range(50)])
    name = unique("tfexec")
    request = transform(gw, name, "batch-server", data.as_uri(), tmp_path / "out",
                        Environment={"SAGEMAKER_EXTRA": "from-the-job"})  # fmt: skip
    assert "BatchStrategy" not in request
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    answers = [json.loads(x) for x in (tmp_path / "out" / "a.csv.out").read_text().splitlines()]
    assert len(answers) == 50
    assert answers[0]["lines"] == 50, "the model's MultiRecord packed every line in one request"
    env = answers[0]["env"]
    assert env["SAGEMAKER_BATCH"] == "true" and env["SAGEMAKER_EXTRA"] == "from-the-job"
    assert env["SAGEMAKER_MAX_PAYLOAD_IN_MB"] == "6"  # what the request (by default) said
    assert env["SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"] == "1"


def test_an_instance_slow_to_exit_is_stopped_after_its_job_is_recorded_completed(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    """A job ends once its output is whole; its instances are stopped after that, and a
    pass over the jobs (the ended one no longer held) must not cut that stop short. The
    model's server ignores SIGTERM (its launcher does not, and exits): it is killed once
    its grace is over, not left running."""
    name = unique("tfslow")
    server = MODELS / "batch_server" / "server.py"
    gw.sm.create_model(
        ModelName=name,
        PrimaryContainer={
            "Image": f"cmd:{sys.executable} {server}",
            "Environment": {"BATCH_SERVER_IGNORES_SIGTERM": name},
        },
        ExecutionRoleArn=ROLE,
    )
    data = tmp_path / "in"
    write_csv(data, "a.csv", [[i] for i in range(5)])
    transform(gw, name, name, data.as_uri(), tmp_path / "out")
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")

    def servers() -> list[int]:
        """The model's server, wherever it was left (an orphan has no parent of ours)."""
        found = []
        for process in psutil.process_iter(["status"]):
            with contextlib.suppress(psutil.Error):
                if process.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if process.environ().get("BATCH_SERVER_IGNORES_SIGTERM") == name:
                    found.append(process.pid)
        return found

    assert servers(), "the job is recorded Completed before its instance is stopped"
    # SIGTERM, then SIGKILL after the backend's grace (10 s).
    wait_until(lambda: servers() == [], "the server killed after its grace", timeout_s=45)


def test_a_concurrency_past_sagemakers_bound_runs_within_it(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    """MaxConcurrentTransforms alone, 64 payloads of the default 6 MB: the job runs 16,
    the most that stay within 100 MB in flight to an instance, and tells the model so."""
    create_model(gw, "lines", "lines", tmp_path)
    data = tmp_path / "in"
    write_csv(data, "a.csv", [[i] for i in range(5)])
    name = unique("tfbound")
    transform(gw, name, "lines", data.as_uri(), tmp_path / "out", MaxConcurrentTransforms=64)
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    assert job["MaxConcurrentTransforms"] == 64  # described as asked
    assert f"transform job {name}: MaxConcurrentTransforms 64 runs as 16" in gw.log()
    # A model of its own is started with what the request says, within the bound.
    server = MODELS / "batch_server" / "server.py"
    gw.sm.create_model(
        ModelName="batch-server-bound",
        PrimaryContainer={"Image": f"cmd:{sys.executable} {server}"},
        ExecutionRoleArn=ROLE,
    )
    name = unique("tfbound")
    transform(gw, name, "batch-server-bound", data.as_uri(), tmp_path / "out2",
              MaxConcurrentTransforms=64)  # fmt: skip
    job = wait_done(gw, name)
    assert job["TransformJobStatus"] == "Completed", job.get("FailureReason")
    answers = [json.loads(x) for x in (tmp_path / "out2" / "a.csv.out").read_text().splitlines()]
    assert answers[0]["env"]["SAGEMAKER_MAX_CONCURRENT_TRANSFORMS"] == "16"
