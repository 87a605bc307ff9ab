"""The CLI's view of a gateway: jobs and endpoints, over boto3's clients and plain HTTP.

Every failure leaves this module as a :class:`GatewayError` whose message fits on one line,
so commands report it and exit without a traceback.

    GatewayError         the gateway refused or could not be reached
     └── Refused         ``POST /inference`` answered with an error status (501, 510, 502)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from shipyard.errors import GatewayError, Refused
from shipyard.records import JobStatus

DEFAULT_URL = "http://127.0.0.1:8080"
FINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED})
_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Submitted:
    """A job the facade scheduled."""

    job_name: str
    slots_remaining: int


@dataclass(frozen=True)
class LogChunk:
    """Bytes of a job's log, where to ask next, and the job's status when they were read."""

    data: bytes
    next_offset: int
    status: str

    @property
    def final(self) -> bool:
        """No more bytes can come after the ones read at ``next_offset``."""
        return self.status in FINAL_STATUSES


class Gateway:
    """A shipyard gateway at ``url``: submit, list, describe, stop and read logs of jobs."""

    def __init__(self, url: str = DEFAULT_URL, *, page_size: int = 100) -> None:
        self.url = url.rstrip("/")
        self.page_size = page_size
        self._clients: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Gateway({self.url!r})"

    @cached_property
    def sagemaker(self) -> Any:
        """boto3's ``sagemaker`` client for the gateway.

        The credentials are dummies: without an ``auth:`` section the gateway accepts any.
        """
        return self.client("sagemaker")

    def client(self, service: str) -> Any:
        """boto3's client of ``service`` (``sagemaker``, ``sagemaker-runtime``, ``logs``,
        ``application-autoscaling``) for the gateway, made once."""
        if service not in self._clients:
            import botocore.config

            config = botocore.config.Config(
                # One attempt: a person at a terminal would rather hear at once that it's down.
                retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=5,
                read_timeout=_TIMEOUT_S,
            )
            with translated(self.url):
                self._clients[service] = self._session.client(
                    service, endpoint_url=self.url, config=config
                )
        return self._clients[service]

    def metrics(self) -> str:
        """The gateway's ``/metrics`` text."""
        try:
            with (
                translated(self.url),
                self._open(urllib.request.Request(self.url + "/metrics")) as r,
            ):
                return str(r.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            raise GatewayError(_error_message(exc)) from None

    @cached_property
    def _session(self) -> Any:
        """A boto3 session with the usual credentials (environment, profile, ...).

        A gateway with an ``auth:`` section checks them; without one it takes any, so
        when none are found, dummies do.
        """
        # Imported here: boto3 takes half a second that `serve` and `--help` need not pay.
        import boto3  # type: ignore[import-untyped]
        import botocore.session

        core = botocore.session.Session()
        # Credentials from the environment and the profile files only: the metadata
        # services of EC2 and ECS are not asked (a terminal is not a cloud instance).
        resolver = core.get_component("credential_provider")
        for provider in ("container-role", "iam-role"):
            resolver.remove(provider)
        session = boto3.session.Session(botocore_session=core, region_name=_region())
        if session.get_credentials() is None:
            session = boto3.session.Session(
                aws_access_key_id="shipyard",
                aws_secret_access_key="shipyard",
                region_name=_region(),
            )
        return session

    def _open(self, request: urllib.request.Request) -> Any:
        """``urlopen`` with the request signed (SigV4) like boto3's calls."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        signed = AWSRequest(
            method=request.get_method(),
            url=request.full_url,
            data=request.data,
            headers=dict(request.header_items()),
        )
        credentials = self._session.get_credentials().get_frozen_credentials()
        SigV4Auth(credentials, "sagemaker", _region()).add_auth(signed)
        for key, value in signed.headers.items():
            request.add_header(key, value)
        return urllib.request.urlopen(request, timeout=_TIMEOUT_S)

    def stack_config(self) -> dict[str, Any]:
        """``GET /stack``: the gateway's topics and jobs section, and their owners."""
        return self._json(urllib.request.Request(self.url + "/stack"))

    def put_stack_config(self, change: dict[str, Any]) -> dict[str, Any]:
        """``PUT /stack``: topics and the jobs section changed as ``change`` says."""
        request = urllib.request.Request(
            self.url + "/stack", data=json.dumps(change).encode(), method="PUT"
        )
        request.add_header("Content-Type", "application/json")
        return self._json(request)

    def _json(self, request: urllib.request.Request) -> dict[str, Any]:
        try:
            with translated(self.url), self._open(request) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise GatewayError(_error_message(exc)) from None
        except ValueError:
            raise GatewayError(f"{request.full_url} did not answer as shipyard does") from None
        if not isinstance(answer, dict):
            raise GatewayError(f"{request.full_url} did not answer as shipyard does")
        return answer

    def submit(self, job_type: str) -> Submitted:
        body = json.dumps({"type": job_type}).encode()
        request = urllib.request.Request(self.url + "/inference", data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        try:
            with translated(self.url), self._open(request) as r:
                answer = json.loads(r.read())
            return Submitted(job_name=answer["jobName"], slots_remaining=answer["slotsRemaining"])
        except urllib.error.HTTPError as exc:
            raise Refused(_error_message(exc), status=exc.code) from None
        except (ValueError, KeyError, TypeError):
            raise GatewayError(f"{self.url}/inference did not answer as shipyard does") from None

    def describe(self, name: str) -> dict[str, Any]:
        """DescribeTrainingJob's output, without boto3's ``ResponseMetadata``."""
        with translated(self.url, about=name):
            job: dict[str, Any] = self.sagemaker.describe_training_job(TrainingJobName=name)
        job.pop("ResponseMetadata", None)
        return job

    def list_jobs(
        self, *, status: str | None = None, name_contains: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Job summaries, newest first, following ``NextToken`` until ``limit`` are found."""
        query: dict[str, Any] = {"SortBy": "CreationTime", "SortOrder": "Descending"}
        if status:
            query["StatusEquals"] = status
        if name_contains:
            query["NameContains"] = name_contains
        found: list[dict[str, Any]] = []
        while len(found) < limit:
            with translated(self.url):
                page = self.sagemaker.list_training_jobs(
                    **query, MaxResults=min(self.page_size, limit - len(found))
                )
            found.extend(page["TrainingJobSummaries"])
            if not page.get("NextToken"):
                break
            query["NextToken"] = page["NextToken"]
        return found

    def stop(self, name: str) -> None:
        with translated(self.url, about=name):
            self.sagemaker.stop_training_job(TrainingJobName=name)

    def logs(self, name: str, offset: int = 0) -> LogChunk:
        """The job's log from byte ``offset`` on (the gateway caps each answer's size)."""
        path = f"/jobs/{urllib.parse.quote(name, safe='')}/logs?offset={offset}"
        try:
            with (
                translated(self.url),
                self._open(urllib.request.Request(self.url + path)) as r,
            ):
                data = r.read()
                headers = r.headers
        except urllib.error.HTTPError as exc:
            raise GatewayError(_error_message(exc)) from None
        return LogChunk(
            data=data,
            next_offset=int(headers.get("X-Shipyard-Next-Offset", offset + len(data))),
            status=headers.get("X-Shipyard-Job-Status", "InProgress"),
        )


@dataclass(frozen=True)
class Progress:
    """A transform job's progress, as the gateway's /metrics has it."""

    objects_done: int
    objects_total: int | None
    records_done: int


class Transforms:
    """Batch transform jobs on a gateway: list, describe, stop, progress."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def __repr__(self) -> str:
        return f"Transforms({self.gateway.url!r})"

    def describe(self, name: str) -> dict[str, Any]:
        """DescribeTransformJob's output, without boto3's ``ResponseMetadata``."""
        with translated(self.gateway.url, about=name):
            job: dict[str, Any] = self.gateway.sagemaker.describe_transform_job(
                TransformJobName=name
            )
        job.pop("ResponseMetadata", None)
        return job

    def list(self, *, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Job summaries, newest first, following ``NextToken`` until ``limit`` are found."""
        query: dict[str, Any] = {"SortBy": "CreationTime", "SortOrder": "Descending"}
        if status:
            query["StatusEquals"] = status
        found: list[dict[str, Any]] = []
        while len(found) < limit:
            with translated(self.gateway.url):
                page = self.gateway.sagemaker.list_transform_jobs(
                    **query, MaxResults=min(self.gateway.page_size, limit - len(found))
                )
            found.extend(page["TransformJobSummaries"])
            if not page.get("NextToken"):
                break
            query["NextToken"] = page["NextToken"]
        return found

    def stop(self, name: str) -> None:
        with translated(self.gateway.url, about=name):
            self.gateway.sagemaker.stop_transform_job(TransformJobName=name)

    def progress(self, name: str) -> Progress:
        """Objects and records done, from ``shipyard_transform_*`` at /metrics."""
        text = self.gateway.metrics()
        values: dict[str, float] = {}
        job = f'job="{name}"'
        for line in text.splitlines():
            if job not in line or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            if series.startswith("shipyard_transform_objects{"):
                state = "total" if 'state="total"' in series else "done"
                values[state] = float(value)
            elif series.startswith("shipyard_transform_records_done{"):
                values["records"] = float(value)
        total = values.get("total")
        return Progress(
            objects_done=int(values.get("done", 0)),
            objects_total=None if total is None else int(total),
            records_done=int(values.get("records", 0)),
        )


@dataclass(frozen=True)
class Answer:
    """What InvokeEndpoint answered."""

    body: bytes
    content_type: str
    variant: str


@dataclass(frozen=True)
class LogLines:
    """Lines of one log stream and the token to read on from."""

    stream: str
    lines: list[str]
    next_token: str


ENDPOINT_LOG_GROUP = "/aws/sagemaker/Endpoints/"


class Endpoints:
    """Endpoints on a gateway: list, describe, invoke, delete and their instances' logs."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def __repr__(self) -> str:
        return f"Endpoints({self.gateway.url!r})"

    def summaries(self, *, name_contains: str | None = None) -> list[dict[str, Any]]:
        """Every endpoint's summary, newest first."""
        query: dict[str, Any] = {"SortBy": "CreationTime", "SortOrder": "Descending"}
        if name_contains:
            query["NameContains"] = name_contains
        found: list[dict[str, Any]] = []
        while True:
            with translated(self.gateway.url):
                page = self.gateway.sagemaker.list_endpoints(
                    **query, MaxResults=self.gateway.page_size
                )
            found.extend(page["Endpoints"])
            if not page.get("NextToken"):
                return found
            query["NextToken"] = page["NextToken"]

    def describe(self, name: str) -> dict[str, Any]:
        """DescribeEndpoint's output, without boto3's ``ResponseMetadata``."""
        with translated(self.gateway.url, about=name):
            endpoint: dict[str, Any] = self.gateway.sagemaker.describe_endpoint(EndpointName=name)
        endpoint.pop("ResponseMetadata", None)
        return endpoint

    def config(self, name: str) -> dict[str, Any]:
        """DescribeEndpointConfig's output, without boto3's ``ResponseMetadata``."""
        with translated(self.gateway.url, about=name):
            config: dict[str, Any] = self.gateway.sagemaker.describe_endpoint_config(
                EndpointConfigName=name
            )
        config.pop("ResponseMetadata", None)
        return config

    def instance_health(self, name: str) -> dict[tuple[str, str], int]:
        """(variant, state) -> instances, from ``shipyard_instances`` at /metrics."""
        counts: dict[tuple[str, str], int] = {}
        pattern = re.compile(r"shipyard_instances\{(.*)\} (\S+)$")
        for line in self.gateway.metrics().splitlines():
            match = pattern.match(line)
            if not match:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            if labels.get("endpoint") == name:
                key = (labels.get("variant", ""), labels.get("state", ""))
                counts[key] = int(float(match.group(2)))
        return counts

    def invoke(
        self,
        name: str,
        body: bytes,
        *,
        content_type: str,
        accept: str | None = None,
        variant: str | None = None,
        target_model: str | None = None,
    ) -> Answer:
        options: dict[str, Any] = {"ContentType": content_type}
        if accept:
            options["Accept"] = accept
        if variant:
            options["TargetVariant"] = variant
        if target_model:
            options["TargetModel"] = target_model
        runtime = self.gateway.client("sagemaker-runtime")
        with translated(self.gateway.url, about=name):
            answer = runtime.invoke_endpoint(EndpointName=name, Body=body, **options)
            data = answer["Body"].read()
        return Answer(
            body=data,
            content_type=answer.get("ContentType", ""),
            variant=answer.get("InvokedProductionVariant", ""),
        )

    def delete(self, name: str) -> None:
        with translated(self.gateway.url, about=name):
            self.gateway.sagemaker.delete_endpoint(EndpointName=name)

    def log_streams(self, name: str) -> list[str]:
        """The endpoint's log streams (``<variant>/<instance id>``), by name."""
        logs = self.gateway.client("logs")
        streams: list[str] = []
        query: dict[str, Any] = {"logGroupName": ENDPOINT_LOG_GROUP + name}
        while True:
            with translated(self.gateway.url, about=name):
                page = logs.describe_log_streams(**query)
            streams.extend(s["logStreamName"] for s in page.get("logStreams", []))
            if not page.get("nextToken"):
                return sorted(streams)
            query["nextToken"] = page["nextToken"]

    def log_lines(self, name: str, stream: str, token: str | None = None) -> LogLines:
        """Lines of ``stream`` from ``token`` on (from the start without one)."""
        query: dict[str, Any] = {
            "logGroupName": ENDPOINT_LOG_GROUP + name,
            "logStreamName": stream,
            "startFromHead": True,
        }
        if token:
            query["nextToken"] = token
        with translated(self.gateway.url, about=name):
            page = self.gateway.client("logs").get_log_events(**query)
        return LogLines(
            stream=stream,
            lines=[event["message"] for event in page.get("events", [])],
            next_token=page.get("nextForwardToken") or token or "",
        )


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


@contextlib.contextmanager
def translated(url: str, *, about: str | None = None) -> Iterator[None]:
    """Turn botocore's and urllib's failures (except HTTP error answers) into GatewayError:
    the gateway's refusal, a request boto3 would not send, or a gateway out of reach.

    SageMaker's messages may not name the job ("Requested resource not found."), so a
    control-plane error ``about`` a job or an endpoint starts with its name.
    """
    from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        message = f"{error.get('Message', exc)} ({error.get('Code', 'Error')})"
        raise GatewayError(f"{about}: {message}" if about else message) from None
    except ParamValidationError as exc:
        # boto3 refused the request before sending it: nothing reached the gateway.
        message = "invalid request, not sent: " + "; ".join(str(exc).splitlines()[1:])
        raise GatewayError(f"{about}: {message}" if about else message) from None
    except urllib.error.HTTPError:
        raise
    except (OSError, BotoCoreError) as exc:
        raise GatewayError(f"cannot reach the gateway at {url}: {_root_cause(exc)}") from None


def _root_cause(exc: BaseException) -> str:
    """The innermost error's words: "Connection refused" rather than three wrappers' worth."""
    while (inner := exc.__cause__ or exc.__context__) is not None:
        exc = inner
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        exc = exc.reason
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _error_message(exc: urllib.error.HTTPError) -> str:
    """The message of a JSON error answer (``errMsg`` or ``message``), else the status line."""
    try:
        body = json.loads(exc.read())
    except (ValueError, OSError):
        body = None
    if isinstance(body, dict):
        message = body.get("errMsg") or body.get("message")
        if isinstance(message, str) and message:
            return " ".join(message.split())
    return f"HTTP {exc.code} {exc.reason}"
