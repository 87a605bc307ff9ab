"""Multi-model routes: the TargetModel a request names, who holds it, and what went wrong.

A variant that serves a ``Mode: MultiModel`` model carries a MultiModelDispatch, set by the
reconciler: its Dispatch strategy (routing/strategies.py), which the router asks to choose
an instance for a TargetModel, to send the request and to learn from the answer. Only
such variants have it, so none of this work lands on the single-model path.

The instance speaks the contract of shipyard/contract.py: every answer says whether the
model was in memory (``X-Shipyard-Model-Cache``), what was unloaded for it
(``X-Shipyard-Evicted``), how many models are loaded, how long loading took, and a
platform error names itself in ``X-Shipyard-Error``. ``observe`` turns those into the
router's view of each instance (``Instance.models``) and into metrics; ``refusal`` turns
platform errors into the runtime's wire errors. A ``cmd:`` server that speaks SageMaker's
``/models`` API instead goes through a ModelAgent (routing/model_agent.py), which answers
with the same headers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shipyard.contract import (
    ERROR,
    EVICTED,
    LOADED_MODELS,
    MODEL_CACHE,
    MODEL_TIMINGS,
    TARGET_MODEL,
    model_name_problem,
    model_url,
    parse_evicted,
    parse_timings,
)
from shipyard.errors import (
    ModelNotReady,
    RuntimeFailure,
    RuntimeValidationError,
    ServiceUnavailable,
)
from shipyard.http.client import OnAnswer, Response, StreamedResponse, in_task
from shipyard.metrics import ModelMetrics
from shipyard.routing.instance import Instance
from shipyard.routing.policies import ModelPolicy
from shipyard.routing.strategies import open_invocation

if TYPE_CHECKING:
    from shipyard.routing.call import Call
    from shipyard.routing.model_agent import ModelAgent

Headers = list[tuple[bytes, bytes]]

CACHE = MODEL_CACHE
TIMINGS = MODEL_TIMINGS
LOADED = LOADED_MODELS

TOO_LARGE = b"ModelTooLarge"
# Errors after which the instance does not hold the model.
_NOT_HELD = frozenset({b"ModelNotFound", b"ModelLoadFailed", TOO_LARGE, b"InvalidTargetModel"})


class MultiModelDispatch:
    """What the data path needs for a variant serving a multi-model prefix.

    ``metrics`` holds each instance's bound series by instance id; ``agent`` is set when
    the instances are ``cmd:`` servers that the gateway loads models into itself.
    """

    __slots__ = ("prefix", "policy", "metrics", "agent")

    names_model = True
    queues = False

    def __init__(
        self,
        *,
        prefix: str,
        policy: ModelPolicy,
        metrics: dict[str, ModelMetrics],
        agent: ModelAgent | None = None,
    ) -> None:
        self.prefix = prefix
        self.policy = policy
        self.metrics = metrics
        self.agent = agent

    def __repr__(self) -> str:
        return f"MultiModelDispatch(prefix={self.prefix!r}, policy={self.policy!r})"

    # -- Dispatch (routing/strategies.py) --------------------------------------------

    @staticmethod
    def prepare(endpoint: str, call: Call) -> None:
        """The TargetModel the request names, kept on the call."""
        if call.model is None:
            call.model = target_model(endpoint, call.headers)

    def platform_error(self, response: Response, call: Call) -> Exception | None:
        """SageMaker's error for the instance's platform error (``refusal``)."""
        if call.model is None:
            return None
        return refusal(response, call.model, self.prefix)

    def choose(self, instances: Sequence[Instance], call: Call) -> Instance | None:
        """The instance for a request for the call's model (model affinity), or None if
        all are full."""
        if call.model is None:
            # The variant became multi-model while the request waited for an instance.
            raise ServiceUnavailable("The variant now serves multiple models; retry naming one.")
        return self.policy.choose(instances, call.model)

    def send(
        self, instance: Instance, call: Call, max_body: int | None, on_answer: OnAnswer
    ) -> Callable[[], None]:
        """Send one invocation of the call's model to ``instance``.

        The instance counts as holding the model from now on, so requests for it that
        follow wait for this load instead of starting another elsewhere. A ``cmd:``
        server's agent loads the model first, in a task.
        """
        model, body = call.model, call.body
        assert model is not None and isinstance(body, bytes)
        if self.agent is not None:
            return in_task(self.agent.invoke(instance, model, call.headers, body), on_answer)
        _touch(instance.models, model)
        return instance.pool.start(b"POST", b"/invocations", call.headers, body, None, on_answer)

    def learn(self, instance: Instance, call: Call, response: Response) -> bool:
        """Observe the answer; True when it was too large for this instance's memory
        budget, while another's may be larger."""
        assert call.model is not None
        self.observe(instance, call.model, response)
        return response.header(ERROR) == TOO_LARGE

    @staticmethod
    def open(
        instance: Instance, call: Call
    ) -> contextlib.AbstractAsyncContextManager[StreamedResponse]:
        """A streamed invocation goes to ``/invocations`` as it came (the built-in
        runtime reads its TargetModel there)."""
        return open_invocation(instance, call)

    @staticmethod
    def unreachable(instance: Instance, call: Call) -> None:
        """The request never reached ``instance``: do not count it as holding the model."""
        if call.model is not None:
            instance.models.pop(call.model, None)

    def observe(self, instance: Instance, model: str, response: Response) -> None:
        """Learn from an answer which models ``instance`` holds, and record its metrics."""
        metrics = self.metrics.get(instance.instance_id)
        cache = response.header(CACHE)
        error = response.header(ERROR)
        if cache is not None:
            _touch(instance.models, model)
            if metrics is not None:
                (metrics.cache_hits if cache == b"hit" else metrics.cache_misses).inc()
        elif error in _NOT_HELD:
            instance.models.pop(model, None)
        evicted = response.header(EVICTED)
        if evicted:
            names = parse_evicted(evicted.decode(errors="replace"))
            for name in names:
                instance.models.pop(name, None)
            if metrics is not None:
                metrics.evictions.inc(len(names))
        if metrics is not None:
            _record(metrics, response)


def resync(instance: Instance, names: list[str]) -> None:
    """Replace the view of what ``instance`` holds with ``names`` (from ``GET /models``).

    Models it already knew keep their order of use; the others go first, as least recent.
    """
    listed = dict.fromkeys(names)
    known = [name for name in instance.models if name in listed]
    instance.models = {
        **{n: None for n in names if n not in instance.models},
        **dict.fromkeys(known),
    }


def _touch(models: dict[str, None], model: str) -> None:
    """Mark ``model`` as the most recently used (last in order)."""
    models.pop(model, None)
    models[model] = None


def _record(metrics: ModelMetrics, response: Response) -> None:
    timings = response.header(TIMINGS)
    if timings:
        histograms = {
            "wait": metrics.wait,
            "download": metrics.download,
            "load": metrics.load,
            "unload": metrics.unload,
        }
        for part, seconds in parse_timings(timings.decode(errors="replace")).items():
            histogram = histograms.get(part)
            if histogram is not None:
                histogram.observe(seconds)
    loaded = response.header(LOADED)
    if loaded is not None and loaded.isdigit():
        metrics.loaded_models.set(int(loaded))


def target_model(endpoint: str, headers: Headers) -> str:
    """The TargetModel of a request to a multi-model endpoint; ValidationError if unusable."""
    raw = next((value for key, value in headers if key == TARGET_MODEL), None)
    if raw is None:
        raise RuntimeValidationError(
            f"Endpoint {endpoint} is a multi-model endpoint: name the model to invoke with "
            "TargetModel (the X-Amzn-SageMaker-Target-Model header)."
        )
    try:
        model = raw.decode()
    except UnicodeDecodeError:
        raise RuntimeValidationError("TargetModel is not valid UTF-8.") from None
    problem = model_name_problem(model)
    if problem is not None:
        shown = model if len(model) <= 80 else model[:80] + "..."
        raise RuntimeValidationError(f"TargetModel {shown!r} is invalid: {problem}.")
    return model


def refusal(response: Response, model: str, prefix: str) -> RuntimeFailure | None:
    """The runtime error for an instance's platform error; None for a model's own error.

    ModelLoadFailed is left to the caller's ModelError, as any failure of the model's code.
    """
    code = response.header(ERROR)
    if code is None or code == b"ModelLoadFailed":
        return None
    text = response.body.decode(errors="replace")
    text = text.removeprefix(code.decode(errors="replace") + ": ")
    if code == b"ModelNotFound":
        return RuntimeValidationError(not_found_message(prefix, model))
    if code == b"ModelNotReady":
        return ModelNotReady(text)
    if code in (b"InvalidTargetModel", TOO_LARGE):
        return RuntimeValidationError(text)
    return None


def not_found_message(prefix: str, model: str) -> str:
    """SageMaker's words for a TargetModel with no artifact under the prefix."""
    url = model_url(prefix, model)
    if url.startswith("s3://"):
        bucket, _, key = url.removeprefix("s3://").partition("/")
        where = f"bucket: {bucket}, key: {key}"
    else:
        where = f"url: {url}"
    return (
        f"Failed to download model data({where}) for TargetModel {model!r}. Please ensure "
        "that there is an object located at the URL and that the role passed to CreateModel "
        "has permissions to download the model."
    )
