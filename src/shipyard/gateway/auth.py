"""Authentication: AWS Signature Version 4 on every door but ``/healthz`` (DESIGN 2.9).

boto3, the AWS CLI, the sagemaker SDK and ``curl --aws-sigv4`` sign by themselves, so a
gateway with an ``auth:`` section needs nothing new from its users but a key. botocore
signs and has no verifier; its signer also derives the signing key anew for every
request and picks the headers itself, where a verifier must take the client's list. So
the check is written here, and the tests hold it to botocore's and curl's signers.

The cost per request is one SHA-256 of the body, one of the canonical request and one
HMAC: the signing key (four HMACs) is cached per key, day, region and service.

Each door counts as the action it performs, so keys can be scoped (``allow`` patterns
as IAM writes them, ``*`` wildcards, case-insensitive):

    POST /  (X-Amz-Target SageMaker.X)      sagemaker:X
    POST /  (AnyScaleFrontendService.X)     application-autoscaling:X
    POST /  (Logs_20140328.X)               logs:X
    /endpoints/{name}/invocations           sagemaker-runtime:InvokeEndpoint
    /endpoints/{name}/async-invocations     sagemaker-runtime:InvokeEndpointAsync
    /endpoints/{name}/invocations-response-stream
                                            sagemaker-runtime:InvokeEndpointWithResponseStream
    /v2/...                                 sagemaker-runtime:InvokeEndpoint
    POST /inference                         sagemaker:CreateTrainingJob
    GET /jobs/{name}/logs                   sagemaker:DescribeTrainingJob
    GET /metrics                            shipyard:GetMetrics
    GET /stack, PUT /stack                  shipyard:GetStack, shipyard:PutStack
    GET /console/api/endpoints...           sagemaker:DescribeEndpoint
    GET /console/api/endpoints/{name}/metrics
                                            shipyard:GetMetrics
    GET /console/api/endpoints/{name}/logs, /console/api/transform-jobs/{name}/logs
                                            logs:GetLogEvents (instance logs)
    GET /console/api/jobs...                sagemaker:DescribeTrainingJob
    GET /console/api/transform-jobs/...     sagemaker:DescribeTransformJob
    GET /console/api/events                 shipyard:GetEvents

The console's pages and static files (``GET /console`` and below, but ``/console/api``)
need no signature: a browser cannot sign a navigation, so they hold no data, and the
page's script signs each ``/console/api`` call itself.
"""

from __future__ import annotations

import calendar
import fnmatch
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import Enum
from functools import lru_cache
from urllib.parse import quote, unquote

from botocore.utils import normalize_url_path

from shipyard.errors import (
    AccessDenied,
    AuthFailure,
    InvalidSignature,
    MissingAuthenticationToken,
    UnrecognizedClient,
)
from shipyard.settings import AuthConfig

_ALGORITHM = "AWS4-HMAC-SHA256"
_MAX_SKEW_S = 15 * 60
_UNSIGNED = "UNSIGNED-PAYLOAD"
_AMZ_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")
_FIELD = re.compile(r"(Credential|SignedHeaders|Signature)=([^,\s]*)")
_BAD_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your AWS Secret Access Key and signing method. Consult the service "
    "documentation for details."
)


class Door(Enum):
    """Which door a request came through: it decides the shape of an auth error."""

    CONTROL = "control"
    RUNTIME = "runtime"
    V2 = "v2"
    FACADE = "facade"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Caller:
    """A verified signer: the key it used and what that key may call."""

    access_key_id: str
    allow: tuple[str, ...]

    def may(self, action: str) -> bool:
        action = action.lower()
        return any(fnmatch.fnmatchcase(action, pattern) for pattern in self.allow)


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """What a verifier reads of one HTTP request; ``headers`` as ASGI gives them."""

    method: str
    raw_path: bytes
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass(frozen=True, slots=True)
class _Key:
    secret: str
    caller: Caller


class Verifier:
    """Checks SigV4 signatures against the configured keys; see the module.

    Raises the ``AuthFailure`` that AWS would answer, worded as AWS words it.
    """

    def __init__(
        self,
        keys: Mapping[str, tuple[str, Iterable[str]]],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = {
            key_id: _Key(secret, Caller(key_id, tuple(p.lower() for p in allow)))
            for key_id, (secret, allow) in keys.items()
        }
        self._clock = clock

    @classmethod
    def from_config(cls, auth: AuthConfig, environ: Mapping[str, str]) -> Verifier:
        """Keys with their secrets read from ``environ``; a missing one fails the start."""
        keys: dict[str, tuple[str, Iterable[str]]] = {}
        for n, key in enumerate(auth.keys):
            secret = environ.get(key.secret_access_key_env)
            if not secret:
                raise ValueError(
                    f"auth.keys[{n}].secret_access_key_env: the environment variable "
                    f"{key.secret_access_key_env} is not set"
                )
            keys[key.access_key_id] = (secret, key.allow)
        return cls(keys)

    def __repr__(self) -> str:
        return f"Verifier(keys={sorted(self._keys)})"

    def verify(self, request: SignedRequest) -> Caller:
        headers = _header_map(request.headers)
        authorization = headers.get("authorization")
        if authorization is None:
            raise MissingAuthenticationToken("Missing Authentication Token")
        algorithm, _, rest = authorization.partition(" ")
        fields = dict(_FIELD.findall(rest))
        if algorithm != _ALGORITHM or len(fields) != 3:
            raise InvalidSignature(
                "Authorization header requires 'Credential', 'SignedHeaders' and "
                f"'Signature' parameters, signed with {_ALGORITHM}."
            )
        scope = fields["Credential"].split("/")
        if len(scope) != 5 or scope[4] != "aws4_request":
            raise InvalidSignature(
                "Credential should be scoped to a valid region, service and aws4_request: "
                f"'{fields['Credential']}'."
            )
        key = self._keys.get(scope[0])
        if key is None:
            raise UnrecognizedClient("The security token included in the request is invalid.")
        stamp = self._timestamp(headers)
        if stamp[:8] != scope[1]:
            raise InvalidSignature(
                f"Date in Credential scope does not match YYYYMMDD from ISO-8601 version of "
                f"date from HTTP: '{scope[1]}' != '{stamp[:8]}', from '{stamp}'."
            )
        signed = fields["SignedHeaders"]
        payload = self._payload_hash(headers, request.body)
        canonical = "\n".join(
            (
                request.method,
                _canonical_uri(request.raw_path),
                _canonical_query(request.query_string),
                _canonical_headers(signed, request.headers),
                signed,
                payload,
            )
        )
        to_sign = "\n".join(
            (
                _ALGORITHM,
                stamp,
                "/".join(scope[1:]),
                hashlib.sha256(canonical.encode()).hexdigest(),
            )
        )
        signing_key = _signing_key(key.secret, scope[1], scope[2], scope[3])
        expected = hmac.new(signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, fields["Signature"]):
            raise InvalidSignature(_BAD_SIGNATURE)
        return key.caller

    def _timestamp(self, headers: Mapping[str, str]) -> str:
        stamp = headers.get("x-amz-date")
        try:
            if stamp is not None:
                # By hand: datetime.strptime alone took a third of a verification.
                match = _AMZ_DATE.fullmatch(stamp)
                if match is None:
                    raise ValueError(f"{stamp!r} is not YYYYMMDDTHHMMSSZ")
                parts = tuple(int(p) for p in match.groups())
                when = datetime.fromtimestamp(calendar.timegm(parts), UTC)
            elif "date" in headers:
                when = parsedate_to_datetime(headers["date"]).astimezone(UTC)
                stamp = when.strftime("%Y%m%dT%H%M%SZ")
            else:
                raise InvalidSignature(
                    "Authorization header requires existence of either a 'X-Amz-Date' or "
                    "a 'Date' header."
                )
        except (ValueError, TypeError, OverflowError) as exc:
            raise InvalidSignature(f"Date must be in ISO-8601 'basic format': {exc}") from None
        now = self._clock()
        skew = when.timestamp() - now
        if abs(skew) > _MAX_SKEW_S:
            raise InvalidSignature(_expired(stamp, now, skew > 0))
        return stamp

    @staticmethod
    def _payload_hash(headers: Mapping[str, str], body: bytes) -> str:
        actual = hashlib.sha256(body).hexdigest()
        declared = headers.get("x-amz-content-sha256")
        if declared is None or declared == actual:
            return actual
        if declared == _UNSIGNED:
            # The signer chose not to sign the body (as clients over TLS may); the
            # signature then covers everything but the body, as on AWS.
            return declared
        raise InvalidSignature(
            "The provided 'x-amz-content-sha256' header does not match what was computed."
        )


def authorize(caller: Caller, action: str, *, account_id: str) -> None:
    """Raise AccessDenied unless ``caller``'s key may call ``action``."""
    if not caller.may(action):
        raise AccessDenied(
            f"User: arn:aws:iam::{account_id}:user/{caller.access_key_id} is not authorized "
            f"to perform: {action} because no identity-based policy allows the {action} action"
        )


def action_of(method: str, path: str, target: str | None) -> tuple[Door, str] | None:
    """The door and scoping action of a request, or None when it needs no signature."""
    if path == "/healthz" or (method == "GET" and _is_console_page(path)):
        return None
    if path.startswith("/console/api/"):
        return Door.OTHER, _console_action(path)
    if path == "/":
        service, _, name = (target or "").partition(".")
        prefix = {
            "SageMaker": "sagemaker",
            "AnyScaleFrontendService": "application-autoscaling",
            "Logs_20140328": "logs",
        }.get(service, "sagemaker")
        return Door.CONTROL, f"{prefix}:{name or 'UnknownOperation'}"
    if path.startswith("/endpoints/"):
        kind = path.rstrip("/").rsplit("/", 1)[-1]
        action = {
            "async-invocations": "InvokeEndpointAsync",
            "invocations-response-stream": "InvokeEndpointWithResponseStream",
        }.get(kind, "InvokeEndpoint")
        return Door.RUNTIME, f"sagemaker-runtime:{action}"
    if path.startswith("/v2"):
        return Door.V2, "sagemaker-runtime:InvokeEndpoint"
    if path == "/inference":
        return Door.FACADE, "sagemaker:CreateTrainingJob"
    if path.startswith("/jobs/"):
        return Door.OTHER, "sagemaker:DescribeTrainingJob"
    if path == "/metrics":
        return Door.OTHER, "shipyard:GetMetrics"
    if path == "/stack":
        return Door.OTHER, "shipyard:GetStack" if method == "GET" else "shipyard:PutStack"
    return Door.OTHER, "shipyard:Unknown"


def _is_console_page(path: str) -> bool:
    return path.rstrip("/") == "/console" or (
        path.startswith("/console/") and not path.startswith("/console/api/")
    )


def _console_action(path: str) -> str:
    kind = path.removeprefix("/console/api/").split("/", 1)[0]
    if kind in ("endpoints", "transform-jobs") and path.endswith("/logs"):
        return "logs:GetLogEvents"
    if kind == "endpoints":
        return "shipyard:GetMetrics" if path.endswith("/metrics") else "sagemaker:DescribeEndpoint"
    return {
        "jobs": "sagemaker:DescribeTrainingJob",
        "transform-jobs": "sagemaker:DescribeTransformJob",
        "events": "shipyard:GetEvents",
    }.get(kind, "shipyard:Unknown")


def _header_map(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    # The few headers the verifier reads itself; a repeated one keeps its last value.
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}


def _canonical_uri(raw_path: bytes) -> str:
    # As botocore builds it for every service but S3: dot segments and doubled slashes
    # removed, then the path as sent (already percent-encoded) encoded once more.
    path = raw_path.decode("latin-1")
    if "." in path or "//" in path or not path:
        path = normalize_url_path(path)
    return quote(path, safe="/~")


def _canonical_query(query_string: bytes) -> str:
    if not query_string:
        return ""
    pairs = []
    for pair in query_string.decode("latin-1").split("&"):
        key, _, value = pair.partition("=")
        pairs.append((quote(unquote(key), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _canonical_headers(signed: str, headers: list[tuple[bytes, bytes]]) -> str:
    # ASGI servers give header names lower-cased already, so they match as bytes.
    names = signed.split(";")
    values: dict[bytes, list[str]] = {name.encode("latin-1"): [] for name in names}
    for key, value in headers:
        found = values.get(key)
        if found is not None:
            found.append(" ".join(value.decode("latin-1").split()))
    return "".join(f"{name}:{','.join(values[name.encode('latin-1')])}\n" for name in names)


@lru_cache(maxsize=256)
def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _expired(stamp: str, now: float, future: bool) -> str:
    fmt = "%Y%m%dT%H%M%SZ"
    current = datetime.fromtimestamp(now, UTC)
    if future:
        limit = datetime.fromtimestamp(now + _MAX_SKEW_S, UTC)
        return (
            f"Signature not yet current: {stamp} is still later than "
            f"{limit.strftime(fmt)} ({current.strftime(fmt)} + 15 min.)"
        )
    limit = datetime.fromtimestamp(now - _MAX_SKEW_S, UTC)
    return (
        f"Signature expired: {stamp} is now earlier than {limit.strftime(fmt)} "
        f"({current.strftime(fmt)} - 15 min.)"
    )


__all__ = [
    "AuthFailure",
    "Caller",
    "Door",
    "SignedRequest",
    "Verifier",
    "action_of",
    "authorize",
]
