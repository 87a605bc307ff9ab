"""The exception tree. Services raise these; each door renders them in its own wire shape.

    ShipyardError                      wire_type, status_code, message
    ├── ValidationException            400  bad input on the control plane
    │   ├── ResourceNotFound           400  SageMaker's "Could not find ..." wording
    │   ├── AlreadyExists              400  "Cannot create already existing model ..."
    │   ├── InvalidParameter           400  a value that breaks a constraint
    │   └── RepeatedHeader             400  a security-relevant header sent twice
    ├── ResourceInUse                  400  a name already taken, or a resource still used
    ├── ResourceLimitExceeded          400  a quota hit
    ├── ObjectNotFound                 400  Application Auto Scaling: no such target or policy
    ├── UnknownOperation               400  an X-Amz-Target we do not implement
    ├── SerializationException         400  a body that is not JSON
    │   └── RequestTooLarge            413  a control-plane body over the door's cap
    ├── SignedBodyTooLarge             413  (ValidationException) a signed body over any cap
    ├── SignedBodyTimeout              408  (ValidationException) a signed body too slow
    ├── RuntimeFailure                      errors of the runtime door (sagemaker-runtime)
    │   ├── RuntimeValidationError     400  unknown endpoint, bad headers, body too large
    │   │   ├── EndpointNotFound       400  no such endpoint (404 on the /v2 doors)
    │   │   ├── PayloadTooLarge        413  a body over the runtime's limit
    │   │   └── BodyTimeout            408  a body that did not arrive in time
    │   ├── ModelError                 424  the model answered with an error status
    │   ├── ModelNotReady              429  instances still starting
    │   ├── Throttling                 429  a serverless variant at its MaxConcurrency
    │   ├── ServiceUnavailable         503  no instance can take the request now
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


class RepeatedHeader(ValidationException):
    """A request carrying a header its security rests on (``X-Amz-Target``,
    ``Authorization``, ``Content-Length``, ...) more than once.

    Refused at the edge before anything reads it: two values let the signature check
    and the door that acts each pick a different one (DESIGN 2.9, "read once").
    """


class ResourceInUse(ShipyardError):
    """A name already taken, or a resource that something else still uses."""

    wire_type = "ResourceInUse"
    status_code = 400


class ResourceLimitExceeded(ShipyardError):
    """A quota of this gateway was hit."""

    wire_type = "ResourceLimitExceeded"
    status_code = 400


class ObjectNotFound(ShipyardError):
    """Application Auto Scaling's missing scalable target or scaling policy."""

    wire_type = "ObjectNotFoundException"
    status_code = 400


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
