"""Authentication: AWS Signature Version 4 on every door but ``/healthz``.

What it guarantees, for operators: SECURITY.md, "With `auth:`".

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
    POST /  (GraniteServiceVersion20100801.X), and
    POST /service/GraniteServiceVersion20100801/operation/X
                                            cloudwatch:X
    /endpoints/{name}/invocations           sagemaker-runtime:InvokeEndpoint
    /endpoints/{name}/async-invocations     sagemaker-runtime:InvokeEndpointAsync
    /endpoints/{name}/invocations-response-stream
                                            sagemaker-runtime:InvokeEndpointWithResponseStream
    /v2/...                                 sagemaker-runtime:InvokeEndpoint
    /v1/... (OpenAI: models, chat, completions, embeddings)
                                            sagemaker-runtime:InvokeEndpoint
    POST /inference                         sagemaker:CreateTrainingJob
    GET /jobs/{name}/logs                   sagemaker:DescribeTrainingJob
    GET /metrics                            shipyard:GetMetrics
    GET /stack, PUT /stack                  shipyard:GetStack, shipyard:PutStack
    GET /console/api/endpoints...           sagemaker:DescribeEndpoint
    GET /console/api/endpoints/{name}/metrics
                                            shipyard:GetMetrics
    GET /console/api/endpoints/{name}/logs, /console/api/transform-jobs/{name}/logs
                                            logs:GetLogEvents (instance logs)
    GET /console/api/endpoints/{name}/captured
                                            shipyard:GetCapturedData (captured bodies)
    GET /console/api/jobs...                sagemaker:DescribeTrainingJob
    GET /console/api/transform-jobs/...     sagemaker:DescribeTransformJob
    GET /console/api/processing-jobs/...    sagemaker:DescribeProcessingJob
    GET /console/api/monitoring-schedules/...
                                            sagemaker:DescribeMonitoringSchedule
    GET /console/api/events                 shipyard:GetEvents
    GET /console/api/models...              sagemaker:DescribeModel
    GET /console/api/endpoint-configs...    sagemaker:DescribeEndpointConfig
    GET /console/api/inference-components...
                                            sagemaker:DescribeInferenceComponent
    GET /console/api/alarms...              cloudwatch:DescribeAlarms
    GET /console/api/whoami                 shipyard:GetCallerPermissions (any valid key)

The console's pages and static files (``GET /console`` and below, but ``/console/api``)
need no signature: a browser cannot sign a navigation, so they hold no data, and the
page's script signs each ``/console/api`` call itself.

The OpenAI-compatible door (``/v1``) also takes ``Authorization: Bearer <token>``, for
a key configured with ``bearer_token_env``: the same caller, with the same scope, as
that key's signature would give (``Verifier.bearer``). No other door takes one.

A request is read once (``read_head``): the headers its security rests on may appear
only once, and what the edge read of them travels to the doors as a value
(``Admitted``, under ``scope[ADMITTED]``) instead of being read again. A signature must
cover ``host``, its date header and (when there is one) ``x-amz-target``, and may leave
the body unsigned (``UNSIGNED-PAYLOAD``) only over TLS. Everything but the body is
checked first (``Verifier.start``), so a request with no key, or a key this gateway
does not know, is refused before a byte of its body is read.

Keys may also be scoped by resource (``resources``, ARN patterns): a door that acts on
an endpoint, model, config or job asks ``Admitted.reach`` with that resource's ARN:
every resource a control-plane request names, at its top level or below it (the models
of CreateEndpointConfig's variants), the job ``POST /inference`` would make, and the
resource each console view shows; lists keep only what the key reaches.
"""

from __future__ import annotations

import calendar
import fnmatch
import hashlib
import hmac
import ipaddress
import re
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import Enum
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import quote, unquote

from botocore.utils import normalize_url_path

from shipyard.errors import (
    AccessDenied,
    AuthFailure,
    InvalidSignature,
    MissingAuthenticationToken,
    RepeatedHeader,
    UnrecognizedClient,
)
from shipyard.gateway.wire.registry import RPC_V2, iam_action, rpc_v2_target
from shipyard.stackfile import AuthConfig

_ALGORITHM = "AWS4-HMAC-SHA256"
BEARER = "Bearer "
_MAX_SKEW_S = 15 * 60
_UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING_EVENTS = "STREAMING-AWS4-HMAC-SHA256-EVENTS"
"""The payload hash of a request whose body is a stream of events, each signed on its
own (``EventSignatures``): the request's signature covers the head alone."""
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
    RPC_V2 = "rpc-v2"
    RUNTIME = "runtime"
    V2 = "v2"
    FACADE = "facade"
    OPENAI = "openai"
    OTHER = "other"


ADMITTED = "shipyard.admitted"
"""The ASGI scope key under which the edge leaves a request's ``Admitted`` value."""

_READ_ONCE = frozenset(
    (
        b"x-amz-target",
        b"authorization",
        b"x-amz-date",
        b"date",
        b"x-amz-content-sha256",
        b"content-length",
        b"host",
    )
)
_JOINED = frozenset((b"origin", b"sec-fetch-site", b"content-type"))
"""Headers the browser rules read (gateway/edge/browser.py): sent more than once, their values
are joined by commas, as HTTP joins a list, and every one of them is checked."""
_READ = _READ_ONCE | _JOINED


class Head(NamedTuple):
    """The headers a request's security rests on, each read once (``read_head``).

    A NamedTuple rather than a frozen dataclass, as immutable and built for every request
    in half the time."""

    target: str | None = None
    authorization: str | None = None
    amz_date: str | None = None
    date: str | None = None
    content_sha256: str | None = None
    content_length: str | None = None
    host: str | None = None
    origin: str | None = None
    fetch_site: str | None = None
    """``Sec-Fetch-Site``."""
    content_type: str | None = None


def read_head(headers: list[tuple[bytes, bytes]]) -> Head:
    """The security-relevant headers of ``headers`` (lower-cased names, as ASGI gives
    them); RepeatedHeader when one of them comes twice, ``Host`` included."""
    found: dict[bytes, str] = {}
    for key, value in headers:
        if key in _READ:
            if key in found:
                if key in _JOINED:
                    found[key] += "," + value.decode("latin-1")
                    continue
                raise RepeatedHeader(
                    f"The request carries the {key.decode('latin-1')} header more than once; "
                    "send it once."
                )
            found[key] = value.decode("latin-1")
    if not found:
        return _NO_HEAD
    return Head(
        target=found.get(b"x-amz-target"),
        authorization=found.get(b"authorization"),
        amz_date=found.get(b"x-amz-date"),
        date=found.get(b"date"),
        content_sha256=found.get(b"x-amz-content-sha256"),
        content_length=found.get(b"content-length"),
        host=found.get(b"host"),
        origin=found.get(b"origin"),
        fetch_site=found.get(b"sec-fetch-site"),
        content_type=found.get(b"content-type"),
    )


_NO_HEAD = Head()


@dataclass(frozen=True, slots=True)
class Caller:
    """A verified signer: the key it used, what that key may call and on what."""

    access_key_id: str
    allow: tuple[str, ...]
    resources: tuple[str, ...] = ("*",)
    """ARN patterns, lower-cased; ``("*",)`` reaches everything."""

    def may(self, action: str) -> bool:
        action = action.lower()
        return any(fnmatch.fnmatchcase(action, pattern) for pattern in self.allow)

    @property
    def reaches_all(self) -> bool:
        return "*" in self.resources

    def reaches(self, arn: str) -> bool:
        """Whether ``arn`` matches one of the key's resource patterns (names in ARNs are
        lower-case, so the match ignores case)."""
        if self.reaches_all:
            return True
        arn = arn.lower()
        return any(_arn_pattern(pattern).fullmatch(arn) for pattern in self.resources)


@lru_cache(maxsize=1024)
def _arn_pattern(pattern: str) -> re.Pattern[str]:
    # As IAM matches a Resource: ``*`` any run of characters (``/`` and ``:`` included),
    # ``?`` any one; nothing else is special.
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.compile("".join(parts), re.DOTALL)


class Admitted(NamedTuple):
    """A request as the edge let it in: the value the doors act on (a NamedTuple, as
    ``Head`` is).

    Doors never read ``X-Amz-Target`` (or any header of ``Head``) again: they take it from
    here, so what was authorised is what runs.
    """

    head: Head
    action: str | None = None
    """The action the request was authorised as; None where nothing was checked (no
    ``auth:`` section, or a path that needs no signature)."""
    caller: Caller | None = None
    """Its verified signer; None where nothing was checked."""
    account_id: str = ""
    """This gateway's account, named in refusals."""

    @property
    def target(self) -> str:
        """``X-Amz-Target`` as read at the edge, "" when absent."""
        return self.head.target or ""

    def reach(self, arn: str) -> None:
        """Raise AccessDenied unless the caller's key reaches the resource ``arn``: what
        every door asks with the ARN it acts on, before it acts."""
        if self.caller is not None and not self.caller.reaches(arn):
            raise _denied(self.caller, self.action or "", self.account_id, arn)

    def may(self, action: str) -> bool:
        """Whether the caller's key is allowed ``action`` too (every action without
        ``auth:``): for a door whose answer shows more to a caller of more power."""
        return self.caller is None or self.caller.may(action)

    def reaches(self, arn: str) -> bool:
        """Whether the caller's key reaches ``arn`` (every resource without ``auth:``)."""
        return self.caller is None or self.caller.reaches(arn)

    @property
    def reaches_all(self) -> bool:
        """Whether the caller's key reaches every resource (no ``resources`` patterns, or
        no ``auth:``): nothing to ask ``reach``, no list to filter."""
        return self.caller is None or self.caller.reaches_all


_OPEN = Admitted(_NO_HEAD)

REQUEST_KEY: ContextVar[str] = ContextVar("shipyard_request_key", default="")
"""The key id of the request a control-plane action runs for ("" with no ``auth:``),
set by the control door around the action: for an action that records who made what
(CloudWatch's series and alarms, bounded per key)."""


def admitted(scope: Mapping[str, object]) -> Admitted:
    """What the edge read of the request in ``scope``.

    A request that did not come through the edge is treated as one with no
    security-relevant headers and no caller: no target to run, nothing reached.
    """
    found = scope.get(ADMITTED)
    return found if isinstance(found, Admitted) else _OPEN


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """What a verifier reads of one HTTP request; ``headers`` as ASGI gives them."""

    method: str
    raw_path: bytes
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    secure: bool = False
    """Whether it came over TLS (``UNSIGNED-PAYLOAD`` is accepted only then)."""


@dataclass(frozen=True, slots=True)
class _Key:
    secret: str
    caller: Caller


@dataclass(frozen=True, slots=True)
class Pending:
    """A signature checked in all but the body: ``Verifier.finish`` checks that part."""

    key: _Key
    canonical_head: str
    """The canonical request up to (not including) the payload hash."""
    stamp: str
    scope: tuple[str, str, str]
    """Day, region and service of the Credential."""
    declared: str | None
    """``x-amz-content-sha256`` as sent."""
    signature: str

    @property
    def needs_body(self) -> bool:
        """Whether the body is signed, so must be read before the signature is known good."""
        return self.declared != _UNSIGNED


class Verifier:
    """Checks SigV4 signatures against the configured keys; see the module.

    Raises the ``AuthFailure`` that AWS would answer, worded as AWS words it.
    """

    def __init__(
        self,
        keys: Mapping[str, tuple[str, Iterable[str]]],
        *,
        resources: Mapping[str, Iterable[str]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        scoped = resources or {}
        self._keys = {
            key_id: _Key(
                secret,
                Caller(
                    key_id,
                    tuple(p.lower() for p in allow),
                    tuple(p.lower() for p in scoped.get(key_id, ("*",))),
                ),
            )
            for key_id, (secret, allow) in keys.items()
        }
        self._clock = clock
        self._bearers: dict[bytes, Caller] = {}

    def accept_bearer(self, key_id: str, token: str) -> None:
        """Take ``token`` as ``Authorization: Bearer`` for key ``key_id`` (its caller, its
        scope) on the door that accepts bearer tokens (``/v1``, the OpenAI-compatible door)."""
        digest = hashlib.sha256(token.encode()).digest()
        if digest in self._bearers:
            raise ValueError("auth.keys: two keys have the same bearer token")
        self._bearers[digest] = self._keys[key_id].caller

    def bearer(self, authorization: str) -> Caller:
        """The caller whose bearer token ``authorization`` (``Bearer <token>``) carries.

        Looked up by the token's SHA-256, so the time a lookup takes says nothing about
        how much of a token was right."""
        token = authorization[len(BEARER) :].strip()  # the scheme matched without case
        caller = self._bearers.get(hashlib.sha256(token.encode()).digest()) if token else None
        if caller is None:
            raise UnrecognizedClient("The bearer token included in the request is invalid.")
        return caller

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
        resources = {key.access_key_id: key.resources for key in auth.keys}
        verifier = cls(keys, resources=resources)
        for n, key in enumerate(auth.keys):
            if key.bearer_token_env is None:
                continue
            token = environ.get(key.bearer_token_env, "").strip()
            if not token:
                raise ValueError(
                    f"auth.keys[{n}].bearer_token_env: the environment variable "
                    f"{key.bearer_token_env} is not set"
                )
            verifier.accept_bearer(key.access_key_id, token)
        return verifier

    def __repr__(self) -> str:
        return f"Verifier(keys={sorted(self._keys)})"

    def verify(self, request: SignedRequest) -> Caller:
        """The whole check of one request, body included (``start`` then ``finish``)."""
        pending = self.start(
            request.method,
            request.raw_path,
            request.query_string,
            request.headers,
            read_head(request.headers),
            secure=request.secure,
        )
        return self.finish(pending, request.body)

    def start(
        self,
        method: str,
        raw_path: bytes,
        query_string: bytes,
        headers: list[tuple[bytes, bytes]],
        head: Head,
        *,
        secure: bool,
    ) -> Pending:
        """Check everything the head says, before any of the body is read: that there is
        a signature, of a known key, dated within 15 minutes, covering what it must."""
        authorization = head.authorization
        if authorization is None:
            raise MissingAuthenticationToken("Missing Authentication Token")
        algorithm, _, rest = authorization.partition(" ")
        found = _FIELD.findall(rest)
        fields = dict(found)
        if algorithm != _ALGORITHM or len(fields) != 3 or len(found) != 3:
            raise InvalidSignature(
                "Authorization header requires 'Credential', 'SignedHeaders' and "
                f"'Signature' parameters, signed with {_ALGORITHM}."
            )
        scope = fields["Credential"].split("/")
        if len(scope) != 5 or scope[4] != "aws4_request":
            raise InvalidSignature(
                "Credential should be scoped to a valid region, service and aws4_request: "
                f"'{fields['Credential'][:200]}'."
            )
        key = self._keys.get(scope[0])
        if key is None:
            raise UnrecognizedClient("The security token included in the request is invalid.")
        signed = fields["SignedHeaders"]
        _check_signed(signed, head)
        stamp = self._timestamp(head)
        if stamp[:8] != scope[1]:
            raise InvalidSignature(
                f"Date in Credential scope does not match YYYYMMDD from ISO-8601 version of "
                f"date from HTTP: '{scope[1][:20]}' != '{stamp[:8]}', from '{stamp}'."
            )
        declared = head.content_sha256
        if declared == _UNSIGNED and not secure:
            raise InvalidSignature(
                "'x-amz-content-sha256: UNSIGNED-PAYLOAD' is accepted only over TLS (https): "
                "over plain HTTP the body must be signed, or anyone on the way could change it."
            )
        canonical_head = "\n".join(
            (
                method,
                _canonical_uri(raw_path),
                _canonical_query(query_string),
                _canonical_headers(signed, headers),
                signed,
            )
        )
        return Pending(
            key=key,
            canonical_head=canonical_head,
            stamp=stamp,
            scope=(scope[1], scope[2], scope[3]),
            declared=declared,
            signature=fields["Signature"],
        )

    def finish(self, pending: Pending, body: bytes) -> Caller:
        """Check the body's hash and the signature itself; the caller when both hold.

        ``body`` is not read when the payload is unsigned (``pending.needs_body``)."""
        payload = _payload_hash(pending.declared, body)
        canonical = f"{pending.canonical_head}\n{payload}"
        day, region, service = pending.scope
        to_sign = "\n".join(
            (
                _ALGORITHM,
                pending.stamp,
                f"{day}/{region}/{service}/aws4_request",
                hashlib.sha256(canonical.encode()).hexdigest(),
            )
        )
        signing_key = _signing_key(pending.key.secret, day, region, service)
        expected = hmac.new(signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), pending.signature.encode("latin-1")):
            raise InvalidSignature(_BAD_SIGNATURE)
        return pending.key.caller

    def _timestamp(self, head: Head) -> str:
        stamp = head.amz_date
        try:
            if stamp is not None:
                # By hand: datetime.strptime alone took a third of a verification.
                match = _AMZ_DATE.fullmatch(stamp)
                if match is None:
                    raise ValueError(f"{stamp[:40]!r} is not YYYYMMDDTHHMMSSZ")
                parts = tuple(int(p) for p in match.groups())
                when = datetime.fromtimestamp(calendar.timegm(parts), UTC)
            elif head.date is not None:
                when = parsedate_to_datetime(head.date).astimezone(UTC)
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


class EventSignatures:
    """The signatures of a request's events, each chained to the one before it as AWS's
    SDKs sign them: the first to the request's own signature.

    Per event the string to sign is ``AWS4-HMAC-SHA256-PAYLOAD``, the event's ``:date``
    (as YYYYMMDDTHHMMSSZ), the scope of that day, the signature before it (hex), the
    SHA-256 of the ``:date`` header as encoded, and the SHA-256 of the payload; the
    ``:chunk-signature`` is its HMAC under the request's key. ``check`` raises
    InvalidSignature for one that does not match, and the chain is then of no use.
    """

    def __init__(self, pending: Pending) -> None:
        self._secret = pending.key.secret
        _, self._region, self._service = pending.scope
        self._prior = pending.signature
        self._keys: dict[str, bytes] = {}

    def __repr__(self) -> str:
        return f"EventSignatures(region={self._region!r})"

    def check(self, stamp: str, date_header: bytes, payload: bytes, signature: bytes) -> None:
        day = stamp[:8]
        key = self._keys.get(day)
        if key is None:
            self._keys = {day: _signing_key(self._secret, day, self._region, self._service)}
            key = self._keys[day]
        to_sign = "\n".join(
            (
                "AWS4-HMAC-SHA256-PAYLOAD",
                stamp,
                f"{day}/{self._region}/{self._service}/aws4_request",
                self._prior,
                hashlib.sha256(date_header).hexdigest(),
                hashlib.sha256(payload).hexdigest(),
            )
        )
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, signature):
            raise InvalidSignature("An event's signature does not match.")
        self._prior = expected.hex()


def _check_signed(signed: str, head: Head) -> None:
    """The headers a signature must cover: ``host``, the header that dates it and
    ``x-amz-target`` when present (it names the action), so that none can be changed
    or added by anyone on the way."""
    names = signed.split(";")
    required = ["host", "x-amz-date" if head.amz_date is not None else "date"]
    if head.target is not None:
        required.append("x-amz-target")
    for name in required:
        if name not in names:
            raise InvalidSignature(
                f"The Authorization header's SignedHeaders must include '{name}'; it lists "
                f"'{signed[:200]}'."
            )


def _payload_hash(declared: str | None, body: bytes) -> str:
    if declared == STREAMING_EVENTS:
        return declared  # each event is signed, chained to this signature
    if declared == _UNSIGNED:
        # The signer chose not to sign the body (over TLS, checked by start); the
        # signature then covers everything but the body, as on AWS.
        return declared
    actual = hashlib.sha256(body).hexdigest()
    if declared is None or declared == actual:
        return actual
    raise InvalidSignature(
        "The provided 'x-amz-content-sha256' header does not match what was computed."
    )


def _denied(caller: Caller, action: str, account_id: str, arn: str | None = None) -> AccessDenied:
    on = f" on resource: {arn}" if arn is not None else ""
    return AccessDenied(
        f"User: arn:aws:iam::{account_id}:user/{caller.access_key_id} is not authorized "
        f"to perform: {action}{on} because no identity-based policy allows the {action} action"
    )


ANY_KEY = "shipyard:GetCallerPermissions"
"""The one action every valid key may call: what the key itself may call and reach
(the console reads it to disable what the key may not use; it tells a key nothing of
another one)."""


def authorize(caller: Caller, action: str, *, account_id: str, arn: str | None = None) -> None:
    """Raise AccessDenied unless ``caller``'s key may call ``action`` (on ``arn``, when
    given: the one place both an action and a resource are decided)."""
    if action == ANY_KEY and arn is None:
        return
    if not caller.may(action) or (arn is not None and not caller.reaches(arn)):
        raise _denied(caller, action, account_id, arn)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this host's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resource_arn(region: str, account_id: str, kind: str, name: str) -> str:
    """The ARN of a resource, as the services write it (names lower-cased, as SageMaker
    does), for the doors to ask ``Admitted.reach`` with."""
    return f"arn:aws:sagemaker:{region}:{account_id}:{kind}/{name.lower()}"


def door_of(path: str) -> Door:
    """The door whose error shape a refusal of ``path`` takes."""
    if path == "/":
        return Door.CONTROL
    if path.startswith(RPC_V2):
        return Door.RPC_V2
    if path.startswith("/endpoints/"):
        return Door.RUNTIME
    if path.startswith("/v2"):
        return Door.V2
    if path.startswith("/v1/") or path == "/v1":
        return Door.OPENAI
    if path == "/inference":
        return Door.FACADE
    return Door.OTHER


def action_of(method: str, path: str, target: str | None) -> tuple[Door, str] | None:
    """The door and scoping action of a request, or None when it needs no signature."""
    if path == "/healthz" or (method == "GET" and is_console_page(path)):
        return None
    if path.startswith("/console/api/"):
        return Door.OTHER, _console_action(path)
    if path == "/":
        return Door.CONTROL, iam_action(target)
    if path.startswith(RPC_V2):
        return Door.RPC_V2, iam_action(rpc_v2_target(path) or "Unknown.UnknownOperation")
    if path.startswith("/endpoints/"):
        kind = path.rstrip("/").rsplit("/", 1)[-1]
        action = {
            "async-invocations": "InvokeEndpointAsync",
            "invocations-response-stream": "InvokeEndpointWithResponseStream",
            "invocations-bidirectional-stream": "InvokeEndpointWithBidirectionalStream",
        }.get(kind, "InvokeEndpoint")
        return Door.RUNTIME, f"sagemaker-runtime:{action}"
    if path.startswith("/v2"):
        return Door.V2, "sagemaker-runtime:InvokeEndpoint"
    if path.startswith("/v1/") or path == "/v1":
        return Door.OPENAI, "sagemaker-runtime:InvokeEndpoint"
    if path == "/inference":
        return Door.FACADE, "sagemaker:CreateTrainingJob"
    if path.startswith("/jobs/"):
        return Door.OTHER, "sagemaker:DescribeTrainingJob"
    if path == "/metrics":
        return Door.OTHER, "shipyard:GetMetrics"
    if path == "/stack":
        return Door.OTHER, "shipyard:GetStack" if method == "GET" else "shipyard:PutStack"
    return Door.OTHER, "shipyard:Unknown"


def is_console_page(path: str) -> bool:
    """Whether ``path`` is one of the console's pages or static files, which hold no data."""
    return path.rstrip("/") == "/console" or (
        path.startswith("/console/") and not path.startswith("/console/api/")
    )


def _console_action(path: str) -> str:
    # Read by the routes' shape (console/door.py): KIND, KIND/NAME, KIND/NAME/VIEW. A
    # resource named "logs" or "metrics" is a NAME, viewed as one, not a VIEW.
    parts = path.removeprefix("/console/api/").split("/")
    kind, view = parts[0], parts[2] if len(parts) == 3 else None
    if kind in ("endpoints", "transform-jobs") and view == "logs":
        return "logs:GetLogEvents"
    if kind == "endpoints" and view == "captured":
        return "shipyard:GetCapturedData"  # the invocations' bodies: more than a Describe
    if kind == "endpoints":
        return "shipyard:GetMetrics" if view == "metrics" else "sagemaker:DescribeEndpoint"
    return {
        "jobs": "sagemaker:DescribeTrainingJob",
        "transform-jobs": "sagemaker:DescribeTransformJob",
        "processing-jobs": "sagemaker:DescribeProcessingJob",
        "monitoring-schedules": "sagemaker:DescribeMonitoringSchedule",
        "events": "shipyard:GetEvents",
        "models": "sagemaker:DescribeModel",
        "endpoint-configs": "sagemaker:DescribeEndpointConfig",
        "inference-components": "sagemaker:DescribeInferenceComponent",
        "alarms": "cloudwatch:DescribeAlarms",
        "whoami": ANY_KEY,
    }.get(kind, "shipyard:Unknown")


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
    "ADMITTED",
    "Admitted",
    "AuthFailure",
    "Caller",
    "Door",
    "Head",
    "Pending",
    "SignedRequest",
    "Verifier",
    "action_of",
    "admitted",
    "authorize",
    "door_of",
    "is_loopback",
    "read_head",
    "resource_arn",
]
