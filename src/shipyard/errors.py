"""The exception tree. Services raise these; each door renders them in its own wire shape.

    ShipyardError                      wire_type, status_code, message
    ├── ValidationException            400  bad input on the control plane
    │   ├── ResourceNotFound           400  SageMaker's "Could not find ..." wording
    │   ├── AlreadyExists              400  "Cannot create already existing model ..."
    │   ├── InvalidParameter           400  a value that breaks a constraint
    │   │   └── OwnedElsewhere         400  a stack changing what another stack owns
    │   └── RepeatedHeader             400  a security-relevant header sent twice
    ├── ResourceInUse                  400  a name already taken, or a resource still used
    ├── MonitoringNotFound             400  no such monitoring schedule or job definition
    ├── ResourceLimitExceeded          400  a quota hit
    ├── ObjectNotFound                 400  Application Auto Scaling: no such target or policy
    ├── LogResourceNotFound            400  CloudWatch Logs: no such log group or stream
    ├── InvalidLogParameter            400  CloudWatch Logs: a bad parameter (a foreign token)
    ├── MetricsFault                        CloudWatch's own codes (``x-amzn-query-error``)
    │   ├── MetricsValidationError     400  ValidationError: a constraint of the model broken
    │   ├── InvalidParameterValue      400  a value CloudWatch refuses
    │   ├── InvalidParameterCombination
    │   │                              400  parameters that do not go together
    │   ├── MissingParameter           400  a parameter an action needs
    │   ├── InvalidNextToken           400  a NextToken that is not ours
    │   ├── LimitExceeded              400  too many alarms or metric series
    │   ├── InvalidFormat              400  StateReasonData that is not JSON
    │   └── AlarmNotFound              404  ResourceNotFound: no such alarm
    ├── UnknownOperation               400  an X-Amz-Target we do not implement
    ├── SerializationException         400  a body that is not JSON
    │   └── RequestTooLarge            413  a control-plane body over the door's cap
    ├── SignedBodyTooLarge             413  (ValidationException) a signed body over any cap
    ├── SignedBodyTimeout              408  (ValidationException) a signed body too slow
    ├── RuntimeFailure                      errors of the runtime door (sagemaker-runtime)
    │   ├── RuntimeValidationError     400  unknown endpoint, bad headers, body too large
    │   │   ├── EndpointNotFound       400  no such endpoint (404 on the /v2 doors)
    │   │   ├── PayloadTooLarge        413  a body over the runtime's limit
    │   │   ├── BodyTimeout            408  a body that did not arrive in time
    │   │   ├── UnsupportedEncoding    415  a Content-Encoding the door does not decode
    │   │   └── MalformedEncoding      400  a body that is not of its Content-Encoding
    │   ├── ModelError                 424  the model answered with an error status
    │   ├── ModelNotReady              429  instances still starting
    │   ├── Throttling                 429  a serverless variant at its MaxConcurrency
    │   ├── ServiceUnavailable         503  no instance can take the request now
    │   │   ├── InstanceFailed         503  an instance failed after the request may have reached it
    │   │   └── AsyncQueueFull         503  an asynchronous endpoint's queue is full (Retry-After)
    │   └── InternalFailure            500  a bug of ours
    ├── AuthFailure                    403  a request that is not signed, or not allowed
    │   ├── MissingAuthenticationToken      no signature at all
    │   ├── UnrecognizedClient              an access key this gateway does not know
    │   ├── InvalidSignature                a wrong, malformed or expired signature
    │   └── AccessDenied                    a key whose ``allow`` lacks the action, or
    │                                       whose ``resources`` lack the resource
    └── FacadeRefusal                       the jobs facade's refusals (POST /inference)
        ├── MissingJobType             501  no or malformed ``type``, or a body not a JSON object
        ├── JobLimitReached            502  ``limit`` jobs are already active
        └── JobTypeNotAllowed          510  ``type`` is not in the white list

The runtime's codes differ from the control plane's on purpose (SageMaker's do too):
boto3's ``sagemaker-runtime`` client knows ``ValidationError``, not ``ValidationException``.

Failures inside the gateway and its instances, never sent as they are: the code that
catches one turns it into an error above, a FailureReason, an instance's answer or an exit
code. By who raises them:

    routing/ (the data path)
      UpstreamError                         the connection to an instance failed mid-request
      └── ResponseTooLarge                  the answer outgrew the limit it was sent with
      ClientGone                            the client left before it could be answered
    http/bodies.py (reading a request's body)
      BodyError                             a body that could not be read whole
      ├── BodyTooLarge                      larger than the door's limit
      ├── BodyTimedOut                      not all there within the door's deadline
      ├── ClientLeft                        the client disconnected before it was whole
      └── BodyEncodingError                 a Content-Encoding not supported, or data not of it
    storage/
      ArtifactError                         model data missing, unreadable, corrupt or unsafe
      NoSuchObject                          a read names no object: no such key, file or bucket
      ObjectStoreError                      reading or writing an object failed otherwise
      UnsupportedLocation                   (ValueError) a URI that names no local path or S3
      ├── UnsupportedScheme                 a scheme other than s3:// or file://
      └── OutsideFileRoots                  a local path outside ``auth.file_roots``
      LinkRefused                           (OSError) a link below a root, where a write goes
    runtime/ (the built-in instance; the codes are its answers)
      CodecError                       400  a request the default codecs cannot handle
      ├── UnsupportedContentType       415  no default decoder for the Content-Type
      ├── UnsupportedAccept            406  no default encoder for any Accept type
      └── InvalidBody                  400  a body that does not parse as its Content-Type says
      MultiModelError                  500  a multi-model request the instance refuses
      ├── InvalidTargetModel           400  a model name missing, too long or out of the prefix
      ├── BadModelRequest              400  a /models body or query not of the contract's form
      ├── ModelNotFound                404  no artifact at ``<prefix>/<name>``
      ├── ModelNotLoaded               404  a /models/{name} route for a model not in memory
      ├── ModelAlreadyLoaded           409  POST /models for a model loaded or loading
      ├── ModelStillLoading            429  still loading when the request stopped waiting
      ├── ModelLoadFailed              500  the artifact not fetched, or the model's code raised
      └── ModelTooLarge                507  alone, more than the whole memory budget
    transform/ (batch transform; the message becomes the job's FailureReason)
      SplitError                            an object that cannot be read as records
      ├── RecordTooLarge                    a record over max_record_bytes or MaxPayloadInMB
      ├── FilterError                       a record a filter or join cannot apply to
      └── AnswerMismatch                    a MultiRecord answer not one line per record
      TransformFailed                       the job cannot go on
    backends/
      BackendError                          an instance could not be started: its FailureReason
      SandboxUnavailable                    (ValueError) ``auth.sandbox`` asked for, none possible
    provisioning/
      FleetFailed                           a fleet could not be brought up: its FailureReason
    jobs/
      ClientError                           a job that cannot run as given: its FailureReason
    cli/ (each becomes one red line and an exit code)
      GatewayError                          the gateway answered with an error, or is unreachable
      ├── Refused                           ``POST /inference`` did not schedule the job
      └── PlanError                         a stack file that cannot be applied as it stands
      SectionConflict                       (ValueError) a topic or jobs section of another stack
    tensors.py
      TensorError                           (ValueError) tensors that do not parse
    events/
      DeliveryError                         (ShipyardError) a subscriber refused a notification
"""

from __future__ import annotations


class ShipyardError(Exception):
    """Root of every error shipyard raises on purpose."""

    wire_type = "InternalFailure"
    status_code = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class ValidationException(ShipyardError):
    """Input the control plane cannot accept."""

    wire_type = "ValidationException"
    status_code = 400


class ResourceNotFound(ValidationException):
    """A model, endpoint config or endpoint that does not exist.

    SageMaker reports these as ValidationException with a fixed wording that boto3's
    waiters match on (``endpoint_deleted`` waits for ``Could not find endpoint``).
    """

    @classmethod
    def of(cls, kind: str, name: str) -> ResourceNotFound:
        return cls(f'Could not find {kind} "{name}".')


class AlreadyExists(ValidationException):
    """A model, endpoint config or endpoint name that is taken.

    SageMaker answers these as ValidationException (jobs: ResourceInUse), and the
    sagemaker SDK ignores a taken model name only on that code and wording.
    """


class InvalidParameter(ValidationException):
    """A parameter that breaks one of the API's constraints."""


class OwnedElsewhere(InvalidParameter):
    """A stack asked to change what another stack owns."""


class RepeatedHeader(ValidationException):
    """A request carrying a header its security rests on (``X-Amz-Target``,
    ``Authorization``, ``Content-Length``, ...) more than once.

    Refused at the edge before anything reads it: two values let the signature check
    and the door that acts each pick a different one (a request is read once, at the edge).
    """


class ResourceInUse(ShipyardError):
    """A name already taken, or a resource that something else still uses."""

    wire_type = "ResourceInUse"
    status_code = 400


class MonitoringNotFound(ShipyardError):
    """A monitoring schedule or job definition that does not exist: SageMaker answers
    these with its own ``ResourceNotFound`` code, not ValidationException."""

    wire_type = "ResourceNotFound"
    status_code = 400


class ResourceLimitExceeded(ShipyardError):
    """A quota of this gateway was hit."""

    wire_type = "ResourceLimitExceeded"
    status_code = 400


class ObjectNotFound(ShipyardError):
    """Application Auto Scaling's missing scalable target or scaling policy."""

    wire_type = "ObjectNotFoundException"
    status_code = 400


class LogResourceNotFound(ShipyardError):
    """CloudWatch Logs' ResourceNotFoundException: no such log group or stream."""

    wire_type = "ResourceNotFoundException"
    status_code = 400


class InvalidLogParameter(ShipyardError):
    """CloudWatch Logs' InvalidParameterException (a token that is not ours, say)."""

    wire_type = "InvalidParameterException"
    status_code = 400


class MetricsFault(ShipyardError):
    """CloudWatch's errors: ``wire_type`` is the query-compatible code botocore's
    errorfactory matches (sent as ``x-amzn-query-error``), ``shape`` the error shape's
    name in the JSON and CBOR protocols."""

    wire_type = "InvalidParameterValue"
    shape = "InvalidParameterValueException"
    status_code = 400


class MetricsValidationError(MetricsFault):
    """A request breaking a constraint of botocore's model, as CloudWatch answers it."""

    wire_type = "ValidationError"
    shape = "ValidationError"


class InvalidParameterValue(MetricsFault):
    """A value CloudWatch refuses (a bad statistic, period, expression...)."""


class InvalidParameterCombination(MetricsFault):
    """Parameters that do not go together."""

    wire_type = "InvalidParameterCombination"
    shape = "InvalidParameterCombinationException"


class MissingParameter(MetricsFault):
    """A parameter the action needs is missing."""

    wire_type = "MissingParameter"
    shape = "MissingRequiredParameterException"


class InvalidNextToken(MetricsFault):
    """A NextToken this gateway did not give."""

    wire_type = "InvalidNextToken"
    shape = "InvalidNextToken"


class LimitExceeded(MetricsFault):
    """Too many alarms or metric series (a quota of this gateway)."""

    wire_type = "LimitExceeded"
    shape = "LimitExceededFault"


class InvalidFormat(MetricsFault):
    """StateReasonData that is not JSON."""

    wire_type = "InvalidFormat"
    shape = "InvalidFormatFault"


class AlarmNotFound(MetricsFault):
    """No alarm of that name."""

    wire_type = "ResourceNotFound"
    shape = "ResourceNotFound"
    status_code = 404


class UnknownOperation(ShipyardError):
    """An ``X-Amz-Target`` action this gateway does not implement."""

    wire_type = "UnknownOperationException"
    status_code = 400


class SerializationException(ShipyardError):
    """A control-plane body that is not a JSON object."""

    wire_type = "SerializationException"
    status_code = 400


class RequestTooLarge(SerializationException):
    """A control-plane body over the door's cap; refused before it is read whole."""

    status_code = 413


class SignedBodyTooLarge(ValidationException):
    """A signed request whose body is larger than any door takes (the signature layer's
    refusal, before any door sees the request)."""

    status_code = 413


class SignedBodyTimeout(ValidationException):
    """A signed request whose body did not arrive in time for its signature to be
    checked."""

    status_code = 408


class RuntimeFailure(ShipyardError):
    """Root of the runtime door's errors (``sagemaker-runtime``)."""

    retry_after_s: int | None = None
    """Seconds a client should wait before trying again, sent as ``Retry-After``."""


class RuntimeValidationError(RuntimeFailure):
    """Unknown endpoint or variant, bad headers, or a body over the size limit."""

    wire_type = "ValidationError"
    status_code = 400


class EndpointNotFound(RuntimeValidationError):
    """An invocation names an endpoint that does not exist: SageMaker says ValidationError,
    the Open Inference Protocol says 404 / NOT_FOUND."""


class PayloadTooLarge(RuntimeValidationError):
    """A request body over the runtime's limit; refused before it is buffered whole."""

    status_code = 413
    body_left = True
    """Whether more of the body is still to come (and should be read and dropped)."""


class BodyTimeout(RuntimeValidationError):
    """A runtime door's request body did not arrive within the door's deadline."""

    status_code = 408


class UnsupportedEncoding(RuntimeValidationError):
    """A request body sent with a ``Content-Encoding`` the door does not decode (the Open
    Inference Protocol's REST door decodes gzip and deflate)."""

    status_code = 415


class MalformedEncoding(RuntimeValidationError):
    """A request body whose data are not of the ``Content-Encoding`` it names."""


class ModelError(RuntimeFailure):
    """The model answered with an error status, or did not answer in time.

    Carries the instance's status and body so the client sees what the model said.
    """

    wire_type = "ModelError"
    status_code = 424

    def __init__(
        self,
        message: str,
        *,
        original_status_code: int,
        original_message: str,
        log_stream_arn: str = "",
    ) -> None:
        super().__init__(message)
        self.original_status_code = original_status_code
        self.original_message = original_message
        self.log_stream_arn = log_stream_arn


class ModelNotReady(RuntimeFailure):
    """The endpoint exists but none of its instances is ready yet; boto3 retries it."""

    wire_type = "ModelNotReadyException"
    status_code = 429


class Throttling(RuntimeFailure):
    """A serverless variant already serves its MaxConcurrency; boto3 retries it."""

    wire_type = "ThrottlingException"
    status_code = 429


class ServiceUnavailable(RuntimeFailure):
    """No instance can take the request now (overload or all instances down)."""

    wire_type = "ServiceUnavailable"
    status_code = 503


class AdmissionRefused(ServiceUnavailable):
    """A variant's priority queue refused the request: full (``reason`` "queue_full"),
    or still waiting at its deadline ("deadline"). Nothing reached the model; every HTTP
    door adds ``Retry-After`` (``retry_after_s``)."""

    def __init__(self, message: str, *, reason: str = "queue_full", retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class InstanceFailed(ServiceUnavailable):
    """The instance failed once the request may have reached it: not sent again."""


class AsyncQueueFull(ServiceUnavailable):
    """An asynchronous endpoint holds its most unfinished requests; nothing was queued."""

    retry_after_s = 30


class InternalFailure(RuntimeFailure):
    """An unexpected failure inside the gateway."""

    wire_type = "InternalFailure"
    status_code = 500


class AuthFailure(ShipyardError):
    """Root of authentication and authorisation refusals: HTTP 403 on every door."""

    wire_type = "AccessDeniedException"
    status_code = 403


class MissingAuthenticationToken(AuthFailure):
    """The request carries no signature, and this gateway has an ``auth:`` section."""

    wire_type = "MissingAuthenticationTokenException"


class UnrecognizedClient(AuthFailure):
    """The signature names an access key this gateway was not given."""

    wire_type = "UnrecognizedClientException"


class InvalidSignature(AuthFailure):
    """The signature does not match, is malformed, or was made over 15 minutes off."""

    wire_type = "InvalidSignatureException"


class AccessDenied(AuthFailure):
    """The key is known and the signature good, but the key may not call this action, or
    not on this resource (its ``resources`` patterns do not match the resource's ARN)."""

    wire_type = "AccessDeniedException"


class FacadeRefusal(ShipyardError):
    """Root of the jobs facade's refusals; the HTTP status is also the body's ``status``."""

    wire_type = "FacadeRefusal"


class MissingJobType(FacadeRefusal):
    """The body is not a JSON object with a non-empty string ``type``."""

    status_code = 501


class JobLimitReached(FacadeRefusal):
    """As many jobs as ``jobs.limit`` allows are active; nothing was scheduled."""

    status_code = 502

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"Failed to schedule inference at the moment, due to reaching limit {limit}."
        )


class JobTypeNotAllowed(FacadeRefusal):
    """The ``type`` is not in ``jobs.white_list``; nothing was scheduled."""

    status_code = 510


class UpstreamError(Exception):
    """The connection failed before a whole response arrived."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent
        """Whether the request may have reached the instance (then it is not retried)."""


class ResponseTooLarge(UpstreamError):
    """The answer's body outgrew the limit the request was sent with; the connection is
    closed, since the rest of the answer is still on its way."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is larger than {limit} bytes", sent=True)
        self.limit = limit


class ClientGone(Exception):
    """The client closed its connection before it could be answered: nobody to answer."""


class BodyError(Exception):
    """The body could not be read whole."""


class BodyTooLarge(BodyError):
    """The body passes ``limit`` bytes; ``body_left``: more of it is still coming."""

    def __init__(self, limit: int, *, body_left: bool) -> None:
        super().__init__(f"the body is larger than {limit} bytes")
        self.limit = limit
        self.body_left = body_left


class BodyTimedOut(BodyError):
    """The whole body did not arrive within ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the body did not arrive within {timeout_s:g} seconds")
        self.timeout_s = timeout_s


class ClientLeft(BodyError):
    """The client disconnected before its body was whole."""


class BodyEncodingError(BodyError):
    """A body whose ``Content-Encoding`` is not supported (``unsupported``), or whose data
    are not of the coding it names."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


class ArtifactError(Exception):
    """Model data that cannot be fetched: missing, unreadable, corrupt or unsafe.

    The message names the URI and the problem in words meant for the user, because the
    control plane shows it verbatim as the endpoint's ``FailureReason``.
    """


class NoSuchObject(Exception):
    """A read names no object: the key, file or bucket does not exist. Names the URI."""


class ObjectStoreError(Exception):
    """Reading or writing an object failed for any other reason; names the URI and cause."""


class UnsupportedLocation(ValueError):
    """A URI that names no local path or S3 location; the message says what to write."""


class UnsupportedScheme(UnsupportedLocation):
    """A URI with a scheme other than ``s3`` or ``file``; ``scheme`` is the one it has."""

    def __init__(self, uri: str, scheme: str) -> None:
        super().__init__(
            f"{uri} has the unsupported scheme '{scheme}'; use s3://, file:// or a local path."
        )
        self.scheme = scheme


class OutsideFileRoots(UnsupportedLocation):
    """A local location outside ``auth.file_roots``; the message names it and the roots."""


class LinkRefused(OSError):
    """A link (or no folder) where a folder below a root was expected: a location is
    reached through no link (beneath.py). Its text is the message alone."""

    def __str__(self) -> str:
        return str(self.strerror)


class CodecError(Exception):
    """A request the default codecs cannot handle; ``status_code`` says why."""

    status_code = 400


class UnsupportedContentType(CodecError):
    """The body's ``Content-Type`` has no default decoder."""

    status_code = 415


class UnsupportedAccept(CodecError):
    """None of the ``Accept`` types has a default encoder."""

    status_code = 406


class InvalidBody(CodecError):
    """The body does not parse as its ``Content-Type`` says it should."""

    status_code = 400


class MultiModelError(Exception):
    """A multi-model request the instance refuses; ``status_code`` is its HTTP status,
    ``code`` what its error header says (the class's name unless it says otherwise)."""

    status_code = 500

    @property
    def code(self) -> str:
        return type(self).__name__


class InvalidTargetModel(MultiModelError):
    """The model name is missing, too long, absolute, or climbs out of the prefix."""

    status_code = 400


class BadModelRequest(MultiModelError):
    """A /models request whose body or query is not of the contract's form."""

    status_code = 400


class ModelNotFound(MultiModelError):
    """No artifact at ``<prefix>/<name>``; not remembered, so a later copy is found."""

    status_code = 404


class ModelNotLoaded(MultiModelError):
    """A /models/{name} route named a model that is not in memory."""

    status_code = 404


class ModelAlreadyLoaded(MultiModelError):
    """POST /models named a model that is in memory or being loaded."""

    status_code = 409


class ModelStillLoading(MultiModelError):
    """The model was still loading when the request stopped waiting; the load goes on.
    Its code is the gateway's ModelNotReady, which the gateway answers with."""

    status_code = 429

    @property
    def code(self) -> str:
        return "ModelNotReady"


class ModelLoadFailed(MultiModelError):
    """The artifact could not be fetched or extracted, or the model's code raised."""

    status_code = 500


class ModelTooLarge(MultiModelError):
    """Loaded alone, the model measured more than the whole memory budget; unloaded."""

    status_code = 507


class SplitError(Exception):
    """An object cannot be read as records of its SplitType (or CompressionType).

    The message says where (a byte offset of the object, as decompressed) and is meant for
    the job's FailureReason."""


class RecordTooLarge(SplitError):
    """A record is larger than the limit: ``max_record_bytes`` while splitting, or the
    payload limit (MaxPayloadInMB) when packing; the job fails with it."""

    def __init__(self, index: int, size: int, limit: int, *, at_least: bool = False) -> None:
        self.index = index
        self.size = size
        self.limit = limit
        amount = f"at least {size}" if at_least else str(size)
        super().__init__(
            f"Record {index + 1} is {amount} bytes, more than the limit of {limit} bytes "
            "(MaxPayloadInMB)."
        )


class FilterError(SplitError):
    """A record that an InputFilter or OutputFilter cannot apply to, or a join cannot read
    (not JSON or CSV, a missing key, an index outside the record)."""


class AnswerMismatch(SplitError):
    """A MultiRecord answer does not carry one line per record it answers."""


class TransformFailed(Exception):
    """The job cannot go on; the message is its FailureReason."""


class BackendError(Exception):
    """An instance could not be started; the message becomes the FailureReason."""


class SandboxUnavailable(ValueError):
    """The gateway was told to sandbox (``auth.sandbox``) and cannot: bubblewrap is
    missing or cannot make a sandbox here. Raised at start; the message says what to do."""


class FleetFailed(Exception):
    """A fleet could not be brought up; the message becomes the FailureReason."""


class ClientError(Exception):
    """The job's request cannot run as given: the message becomes its FailureReason.

    SageMaker calls such failures ClientError, as opposed to the script's AlgorithmError.
    """


class GatewayError(Exception):
    """The gateway answered with an error, or could not be reached; the message is one line."""


class Refused(GatewayError):
    """``POST /inference`` did not schedule the job; the message is the gateway's ``errMsg``."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class PlanError(GatewayError):
    """The file cannot be applied as it stands (a name conflict, a missing reference)."""


class SectionConflict(ValueError):
    """The file declares a topic or a jobs section that another stack owns."""


class TensorError(ValueError):
    """Tensors that do not parse: malformed JSON, a wrong shape, data that do not fit."""


class DeliveryError(ShipyardError):
    """A subscriber did not take a notification; the message is apprise's reason."""
