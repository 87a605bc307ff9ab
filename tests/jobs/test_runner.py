"""The job runner as the gateway uses it: a real process on a working folder.

Each test writes job.json, starts ``python -m shipyard.jobs.runner`` in its own session,
waits for the final line of status.jsonl and reads what the job left behind: status
lines, the uploaded archives, what the script saw, job.log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from shipyard.job_contract import Channel, Checkpoint, JobSpec, read_status
from tests.conftest import Bucket

SCRIPTS = Path(__file__).parent / "scripts"
JOB_NAME = "model_a-20261122-101500-123"


@dataclass
class RunnerProcess:
    """A runner started on ``workdir``; the fixture kills it and its script by PID."""

    workdir: Path
    process: subprocess.Popen[bytes]

    def statuses(self) -> list[dict[str, Any]]:
        text = (self.workdir / "status.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines()]

    def secondaries(self) -> list[str]:
        return [line["secondary"] for line in self.statuses()]

    def log(self) -> str:
        return (self.workdir / "job.log").read_text()

    def wait_final(self, timeout_s: float = 30) -> dict[str, Any]:
        """The final record, once the runner wrote it and exited 0."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = read_status(self.workdir / "status.jsonl")
            if lines and lines[-1].final is not None:
                assert self.process.wait(10) == 0
                finals = [line for line in self.statuses() if "final" in line]
                assert len(finals) == 1, "exactly one final line"
                return finals[0]["final"]  # type: ignore[no-any-return]
            time.sleep(0.05)
        raise AssertionError(f"no final status line in time; job.log:\n{self.log()}")

    def wait_log(self, text: str, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                if text in self.log():
                    return
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared in job.log")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def start_runner(tmp_path: Path) -> Iterator[Callable[..., RunnerProcess]]:
    started: list[RunnerProcess] = []

    def start(spec: JobSpec, *, workdir: str = "work", args: tuple[str, ...] = ()) -> RunnerProcess:
        folder = tmp_path / workdir
        folder.mkdir()
        (folder / "job.json").write_text(spec.to_json())
        process = subprocess.Popen(
            [sys.executable, "-m", "shipyard.jobs.runner", str(folder), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        runner = RunnerProcess(folder, process)
        started.append(runner)
        return runner

    yield start
    for runner in started:
        if runner.process.poll() is None:
            _kill_group(runner.process.pid)
            runner.process.wait()
        with contextlib.suppress(OSError, ValueError):
            _kill_group(int((runner.workdir / "script.pid").read_text()))


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """A channel's data: nested files, and an archive that must arrive unextracted."""
    data = tmp_path / "in"
    (data / "sub").mkdir(parents=True)
    (data / "a.csv").write_text("1,2\n")
    (data / "sub" / "b.csv").write_text("3,4\n")
    with tarfile.open(data / "c.tar.gz", "w:gz") as tar:
        tar.add(data / "a.csv", arcname="inside.csv")
    return data


@pytest.fixture
def make_spec(tmp_path: Path, inputs: Path) -> Callable[..., JobSpec]:
    def make(program: str = "train.py", **changes: Any) -> JobSpec:
        spec = JobSpec(
            name=JOB_NAME,
            arn=f"arn:aws:sagemaker:us-east-1:000000000000:training-job/{JOB_NAME}",
            image="shipyard/python",
            program=program,
            submit_directory=SCRIPTS.as_uri(),
            hyperparameters={
                "sagemaker_program": program,
                "sagemaker_submit_directory": SCRIPTS.as_uri(),
                "epochs": "3",
                "lr": "0.5",
                "name": "abc",
            },
            channels=(Channel(name="data", uri=inputs.as_uri()),),
            output_path=(tmp_path / "out").as_uri(),
            started_at=time.time(),
            stop_grace_s=10,
            environment={"K": "V"},
        )
        return replace(spec, **changes)

    return make


def output_of(tmp_path: Path, name: str) -> Path:
    return tmp_path / "out" / JOB_NAME / "output" / name


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def pack_scripts(dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        for script in SCRIPTS.iterdir():
            tar.add(script, arcname=script.name)
    return dest


# -- success ---------------------------------------------------------------------------------


@pytest.mark.parametrize("submit", ["tar.gz", "folder"])
def test_a_successful_script_has_its_model_and_output_uploaded(
    submit: str, tmp_path: Path, inputs: Path, make_spec: Any, start_runner: Any
) -> None:
    code = pack_scripts(tmp_path / "sourcedir.tar.gz") if submit == "tar.gz" else SCRIPTS
    single = tmp_path / "single.json"
    single.write_text("{}")
    spec = make_spec(
        submit_directory=str(code) if submit == "tar.gz" else code.as_uri(),
        channels=(
            Channel(name="data", uri=inputs.as_uri(), content_type="text/csv"),
            Channel(name="single", uri=str(single)),
        ),
    )
    runner = start_runner(spec)

    final = runner.wait_final()

    model_uri = output_of(tmp_path, "model.tar.gz").as_uri()
    assert final == {
        "status": "Completed",
        "failure_reason": None,
        "model_artifacts": model_uri,
        "exit_code": 0,
    }
    assert runner.secondaries() == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    assert runner.statuses()[2]["message"] == (
        "Training image download completed. Training in progress."
    )
    model = members(output_of(tmp_path, "model.tar.gz"))
    assert set(model) == {"seen.json", "weights/w.bin"}, "contents at the archive root"
    assert members(output_of(tmp_path, "output.tar.gz")) == {"result.txt": b"lr=0.5"}
    seen = json.loads(model["seen.json"])
    assert seen["channel_files"] == ["a.csv", "c.tar.gz", "sub/b.csv"], "copied, not extracted"
    assert (runner.workdir / "ml" / "input" / "data" / "single" / "single.json").exists()
    assert seen["argv"] == ["--epochs", "3", "--lr", "0.5", "--name", "abc"]
    assert seen["cwd"] == str(runner.workdir / "ml" / "code")
    assert seen["config"]["inputdataconfig.json"]["data"] == {
        "ContentType": "text/csv",
        "TrainingInputMode": "File",
        "S3DistributionType": "FullyReplicated",
        "RecordWrapperType": "None",
    }
    assert seen["config"]["hyperparameters.json"] == spec.hyperparameters
    assert seen["config"]["resourceconfig.json"]["hosts"] == ["algo-1"]
    log = runner.log()
    assert "[shipyard] Downloading input data" in log
    assert "training epoch 2\n" in log and "a warning on stderr\n" in log


def test_the_script_sees_sagemakers_environment(
    tmp_path: Path, make_spec: Any, start_runner: Any
) -> None:
    runner = start_runner(make_spec())
    assert runner.wait_final()["status"] == "Completed"

    env = json.loads(members(output_of(tmp_path, "model.tar.gz"))["seen.json"])["env"]
    ml = runner.workdir / "ml"
    assert json.loads(env["SM_HPS"]) == {"epochs": 3, "lr": 0.5, "name": "abc"}
    assert env["SM_HP_EPOCHS"] == "3" and env["SM_HP_NAME"] == "abc"
    assert "SM_HP_SAGEMAKER_PROGRAM" not in env
    assert json.loads(env["SM_USER_ARGS"]) == ["--epochs", "3", "--lr", "0.5", "--name", "abc"]
    assert json.loads(env["SM_CHANNELS"]) == ["data"]
    assert env["SM_CHANNEL_DATA"] == str(ml / "input" / "data" / "data")
    assert env["SM_MODEL_DIR"] == str(ml / "model")
    assert env["SM_OUTPUT_DATA_DIR"] == str(ml / "output" / "data")
    assert env["SM_OUTPUT_DIR"] == str(ml / "output")
    assert env["SM_INPUT_CONFIG_DIR"] == str(ml / "input" / "config")
    assert env["SM_CHECKPOINT_DIR"] == str(ml / "checkpoints")
    assert env["SM_CURRENT_HOST"] == "algo-1" and json.loads(env["SM_HOSTS"]) == ["algo-1"]
    assert env["SM_NUM_GPUS"] == "0" and int(env["SM_NUM_CPUS"]) >= 1
    assert env["SM_USER_ENTRY_POINT"] == "train.py" and env["SM_MODULE_NAME"] == "train"
    assert env["TRAINING_JOB_NAME"] == JOB_NAME and env["K"] == "V"
    assert env["TRAINING_JOB_ARN"].endswith(f"training-job/{JOB_NAME}")
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert training_env["channel_input_dirs"] == {"data": env["SM_CHANNEL_DATA"]}
    assert training_env["job_name"] == JOB_NAME
    assert json.loads(env["SM_INPUT_DATA_CONFIG"])["data"]["TrainingInputMode"] == "File"
    assert json.loads(env["SM_RESOURCE_CONFIG"])["current_host"] == "algo-1"


def test_a_shell_program_gets_the_hyperparameters_as_arguments(
    tmp_path: Path, make_spec: Any, start_runner: Any
) -> None:
    runner = start_runner(make_spec("args.sh"))
    assert runner.wait_final()["status"] == "Completed"

    model = members(output_of(tmp_path, "model.tar.gz"))
    assert model["args.txt"].decode().split() == ["--epochs", "3", "--lr", "0.5", "--name", "abc"]
    assert model["env.txt"].decode().split() == ["algo-1", JOB_NAME]
    assert "shell says hello" in runner.log()


def test_a_cmd_image_runs_its_command_through_the_shell(
    tmp_path: Path, make_spec: Any, start_runner: Any
) -> None:
    spec = make_spec(
        image='cmd:echo "$TRAINING_JOB_NAME" > "$SM_MODEL_DIR/name.txt"',
        program=None,
        submit_directory=None,
        hyperparameters={},
    )
    runner = start_runner(spec)
    assert runner.wait_final()["status"] == "Completed"
    assert members(output_of(tmp_path, "model.tar.gz")) == {"name.txt": f"{JOB_NAME}\n".encode()}


def test_s3_channels_are_copied_object_by_object(
    bucket: Bucket, make_spec: Any, start_runner: Any
) -> None:
    bucket.put("in/a.csv", b"1,2\n")
    bucket.put("in/sub/b.csv", b"3,4\n")
    single = bucket.put("other/single.json", b"{}")
    spec = make_spec(
        channels=(
            Channel(name="data", uri=f"s3://{bucket.name}/in/"),
            Channel(name="single", uri=single),
        ),
        output_path=f"s3://{bucket.name}/out",
    )
    runner = start_runner(spec, args=("--s3-endpoint-url", bucket.endpoint_url))

    assert runner.wait_final()["status"] == "Completed"

    data = runner.workdir / "ml" / "input" / "data"
    assert (data / "data" / "sub" / "b.csv").read_text() == "3,4\n"
    assert (data / "single" / "single.json").read_text() == "{}"
    keys = bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="out/")["Contents"]
    assert sorted(k["Key"] for k in keys) == [
        f"out/{JOB_NAME}/output/model.tar.gz",
        f"out/{JOB_NAME}/output/output.tar.gz",
    ]


def test_an_empty_s3_prefix_fails_the_job_naming_it(
    bucket: Bucket, make_spec: Any, start_runner: Any
) -> None:
    uri = f"s3://{bucket.name}/nothing/here"
    runner = start_runner(
        make_spec(channels=(Channel(name="train", uri=uri),)),
        args=("--s3-endpoint-url", bucket.endpoint_url),
    )

    assert runner.wait_final()["failure_reason"] == (
        f"ClientError: Could not find input data of channel 'train' at {uri}."
    )


# -- failure ---------------------------------------------------------------------------------


def test_a_failure_file_is_the_failure_reason_and_output_is_still_uploaded(
    tmp_path: Path, make_spec: Any, start_runner: Any
) -> None:
    runner = start_runner(make_spec("fail_with_file.py"))

    final = runner.wait_final()

    assert final == {
        "status": "Failed",
        "failure_reason": "Bad input: column 'x' is missing",
        "model_artifacts": None,
        "exit_code": 1,
    }
    assert runner.secondaries() == ["Starting", "Downloading", "Training", "Failed"]
    assert members(output_of(tmp_path, "output.tar.gz")) == {"partial.txt": b"half done"}
    assert not output_of(tmp_path, "model.tar.gz").exists()


def test_without_a_failure_file_the_reason_is_the_exit_code_and_stderr_tail(
    make_spec: Any, start_runner: Any
) -> None:
    runner = start_runner(make_spec("fail_with_traceback.py"))

    reason = runner.wait_final()["failure_reason"]

    assert reason.startswith("AlgorithmError: ExitCode 1: ")
    assert reason.endswith("ValueError: the data is bad")
    assert "noise line 29" in reason and "noise line 0\n" not in reason, "only the tail"
    assert len(reason) <= 1024


def test_a_missing_channel_fails_the_job_naming_its_uri(
    tmp_path: Path, make_spec: Any, start_runner: Any
) -> None:
    missing = (tmp_path / "nowhere").as_uri()
    runner = start_runner(make_spec(channels=(Channel(name="train", uri=missing),)))

    final = runner.wait_final()

    assert final["status"] == "Failed"
    assert final["failure_reason"] == (
        f"ClientError: Could not find input data of channel 'train' at {missing}."
    )
    assert runner.secondaries() == ["Starting", "Downloading", "Failed"]
    assert not (runner.workdir / "script.pid").exists()


def test_an_unwritable_output_location_fails_the_job(make_spec: Any, start_runner: Any) -> None:
    runner = start_runner(make_spec(output_path="ftp://example.com/out"))

    final = runner.wait_final()

    assert final["status"] == "Failed"
    assert final["failure_reason"] == (
        f"ClientError: Output location ftp://example.com/out/{JOB_NAME}/output/model.tar.gz "
        "has the unsupported scheme 'ftp'; use s3://, file:// or a local path."
    )


def test_an_unreadable_job_file_still_ends_with_a_final_line(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "job.json").write_text('{"name": "x"}')

    subprocess.run(
        [sys.executable, "-m", "shipyard.jobs.runner", str(workdir)],
        check=True,
        timeout=30,
        capture_output=True,
    )

    last = read_status(workdir / "status.jsonl")[-1]
    assert last.secondary == "Failed" and last.final is not None
    assert last.final.failure_reason is not None
    assert last.final.failure_reason.startswith("ClientError: Could not read the job's job.json")
    assert "arn: Field required" in last.final.failure_reason


# -- stopping --------------------------------------------------------------------------------


def test_sigterm_stops_the_job_and_uploads_what_the_script_saved(
    tmp_path: Path, make_spec: Any, start_runner: Any
) -> None:
    runner = start_runner(make_spec("graceful.py"))
    runner.wait_log("ready")

    runner.process.send_signal(signal.SIGTERM)
    final = runner.wait_final()

    assert final["status"] == "Stopped" and final["exit_code"] == 0
    assert final["model_artifacts"] == output_of(tmp_path, "model.tar.gz").as_uri()
    assert runner.secondaries()[-3:] == ["Stopping", "Uploading", "Stopped"]
    assert members(output_of(tmp_path, "model.tar.gz")) == {"saved.txt": b"saved on SIGTERM"}


def test_a_script_that_ignores_sigterm_is_killed_after_the_grace_time(
    make_spec: Any, start_runner: Any
) -> None:
    runner = start_runner(make_spec("stubborn.py", stop_grace_s=1))
    runner.wait_log("ready")
    script_pid = int((runner.workdir / "script.pid").read_text())

    runner.process.send_signal(signal.SIGTERM)
    final = runner.wait_final()

    assert final["status"] == "Stopped" and final["exit_code"] == -signal.SIGKILL
    assert "sending SIGKILL" in runner.log()
    assert not (runner.workdir / "script.pid").exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(script_pid, 0)


def test_reaching_the_max_runtime_stops_the_job(
    tmp_path: Path, make_spec: Any, start_runner: Any
) -> None:
    # The runtime counts from the job's start, the runner's own start included: long
    # enough for the script to be running when it ends, on a loaded machine too (2 s
    # ended one during its download in a CI run).
    runner = start_runner(make_spec("graceful.py", max_runtime_s=8, started_at=time.time()))
    runner.wait_log("ready")

    final = runner.wait_final()

    assert final["status"] == "Stopped"
    assert runner.secondaries()[-4:] == ["Training", "Stopping", "Uploading", "MaxRuntimeExceeded"]
    assert members(output_of(tmp_path, "model.tar.gz")) == {"saved.txt": b"saved on SIGTERM"}


# -- checkpoints -----------------------------------------------------------------------------


def test_a_lost_job_resumes_from_its_synced_checkpoint(
    bucket: Bucket, make_spec: Any, start_runner: Any
) -> None:
    """Attempt 1 syncs checkpoints to S3 and is lost (kill -9 of the runner, then of its
    orphaned script, as the gateway does); attempt 2 starts from the last synced one."""
    args = ("--s3-endpoint-url", bucket.endpoint_url, "--checkpoint-sync-period-s", "0.3")
    spec = make_spec(
        "checkpointed.py",
        hyperparameters={"sagemaker_program": "checkpointed.py", "steps": "16", "step-s": "0.15"},
        checkpoint=Checkpoint(uri=f"s3://{bucket.name}/ckpt/{JOB_NAME}"),
        output_path=f"s3://{bucket.name}/out",
    )
    first = start_runner(spec, workdir="attempt-1", args=args)
    assert synced_step(bucket, at_least=3) >= 3

    first.process.kill()
    first.process.wait()
    os.killpg(int((first.workdir / "script.pid").read_text()), signal.SIGKILL)
    last_synced = synced_step(bucket, at_least=0)
    assert "final" not in first.statuses()[-1]

    second = start_runner(replace(spec, attempt=2), workdir="attempt-2", args=args)
    final = second.wait_final()

    assert final["status"] == "Completed"
    assert final["model_artifacts"] == f"s3://{bucket.name}/out/{JOB_NAME}/output/model.tar.gz"
    assert f"resuming at step {last_synced + 1}" in second.log()
    model = bucket.client.get_object(Bucket=bucket.name, Key=f"out/{JOB_NAME}/output/model.tar.gz")
    archive = second.workdir / "downloaded.tar.gz"
    archive.write_bytes(model["Body"].read())
    result = json.loads(members(archive)["result.json"])
    assert result == {"resumed_at": last_synced + 1, "steps": 16}
    assert synced_step(bucket, at_least=15) == 15, "the last checkpoint is synced at the end"


def synced_step(bucket: Bucket, *, at_least: int, timeout_s: float = 20) -> int:
    """The step of the checkpoint in S3, once it is ``at_least``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(bucket.client.exceptions.NoSuchKey):
            body = bucket.client.get_object(Bucket=bucket.name, Key=f"ckpt/{JOB_NAME}/state.json")
            step = int(json.loads(body["Body"].read())["step"])
            if step >= at_least:
                return step
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint at step {at_least} or later was synced")


# -- the spec --------------------------------------------------------------------------------


def test_a_job_spec_survives_its_json_and_ignores_unknown_keys(make_spec: Any) -> None:
    spec = make_spec(checkpoint=Checkpoint(uri="s3://b/ckpt", local_path="/opt/ml/ck"))
    data = json.loads(spec.to_json())
    data["added_by_a_newer_gateway"] = True

    assert JobSpec.from_json(json.dumps(data)) == spec
    assert JobSpec.from_dict(data) == spec
    assert set(json.loads(spec.to_json())) == {
        "name", "arn", "image", "program", "submit_directory", "hyperparameters", "channels",
        "output_path", "checkpoint", "max_runtime_s", "started_at", "stop_grace_s",
        "environment", "resource", "attempt", "entrypoint", "arguments", "network_isolation",
    }  # fmt: skip
    with_image = make_spec(entrypoint=("python3", "/opt/program/train.py"), arguments=("--x", "1"))
    assert JobSpec.from_json(with_image.to_json()) == with_image
