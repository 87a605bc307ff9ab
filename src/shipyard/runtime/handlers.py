"""Load the user's ``code/inference.py`` and bind its handlers to the loaded model.

The user contract is the SageMaker inference toolkit's, and nothing more:

- ``model_fn(model_dir)`` loads the model; without it the model is ``None``.
- ``input_fn(input_data, content_type)`` decodes the body; default: :func:`codecs.decode`.
- ``predict_fn(data, model)`` runs the model; default: ``model.predict(data)`` if the
  model has ``predict``, else ``model(data)`` if it is callable, else ``data`` unchanged
  (so a model directory without code echoes its input).
- ``output_fn(prediction, accept)`` encodes the result; default: :func:`codecs.encode`.
- ``transform_fn(model, input_data, content_type, accept)`` replaces the three above.

Open Inference Protocol requests (``application/vnd.shipyard.v2+tensors``, see
:mod:`shipyard.tensors`) are decoded by the runtime into ``{input name: numpy array}``
first: ``predict_tensors_fn(inputs, model) -> dict`` is called when the program defines
it; otherwise the handlers above run with that dict as ``input_data`` and that content
type, and the default ``output_fn`` encodes the dict (or one array) the chain returns.

``output_fn`` and ``transform_fn`` return bytes or str (sent with the ``Accept`` type), or
a ``(body, content_type)`` tuple; an iterator or generator in place of the body (or from
``predict_fn``) is a streamed answer, one chunk per item (:mod:`streaming`). Any handler
may take an extra keyword parameter ``context``: a :class:`Context` carrying the request's
custom attributes, its stateful session (and the adapter it names), whether its client
has gone (``cancelled``), and taking the response's. Which handlers
want it is decided once, at load time, so a request pays for one flag test per handler.

Adapters (adapter inference components, :mod:`adapters`): a ``model_fn`` that takes a
second argument, ``model_fn(model_dir, adapter_dir)``, is called once per adapter with its
extracted folder, and returns the model that serves the adapter's requests (the base
model with the adapter applied, say, as LoRA adapters are); without one, the adapter's
folder is loaded as a model of its own. Handlers see the adapter's name in
``context.adapter``.

Handlers are plain synchronous functions, called on the event loop or on a handler thread
(:mod:`workers`): an instance serves one request at a time by default, like one SageMaker
model-server worker.

Server-side batching (:mod:`batching`), when the model's Environment sets
``SHIPYARD_MAX_BATCH_SIZE``: ``predict_batch_fn(data_list, model) -> list`` replaces
``predict_fn`` and receives the ``input_fn`` results of requests from many clients; it
returns one prediction per item, in order, each handed to that request's ``output_fn``.
An item may be an ``Exception`` instance, which fails that request alone; if
``predict_batch_fn`` raises, every request of the batch fails with its error. It takes no
``context``; ``input_fn`` and ``output_fn`` may, per request as above.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import threading
from collections.abc import Callable, Sequence, Sized
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from shipyard.runtime import codecs, streaming

if TYPE_CHECKING:
    from shipyard.runtime.batching import Batcher

DEFAULT_PROGRAM = "inference.py"

Handler = Callable[..., Any]
Request = tuple[bytes, str, str, "Context | None"]
"""One request of a batch: body, content type, accept and context."""

_SESSION_ID = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
_MAX_SESSION_ID = 256
_PENDING: Any = ("pending", "")  # an answer slot not yet filled, told apart by identity


_NEVER_LOST = threading.Event()
"""The ``cancelled`` of a context whose connection nobody watches: never set."""


def watch_loss(context: Context) -> threading.Event:
    """The event that makes ``context.cancelled`` True, for the runtime to set (from its
    event loop) once the request's connection is lost."""
    lost = context._lost = threading.Event()
    return lost


class Context:
    """What a handler may learn about the request and add to the response.

    ``request_custom_attributes`` is the ``X-Amzn-SageMaker-Custom-Attributes`` header of
    the request (``None`` when absent); setting ``response_custom_attributes`` sends that
    header back with the response. ``adapter`` names the adapter the request is for (an
    adapter inference component, registered through ``load_adapter_fn``), or is None for
    the base model.

    Stateful sessions: ``session_id`` is the request's session (``"NEW_SESSION"`` when the
    client asks for one, None without). A handler answering a NEW_SESSION opens the
    session with ``open_session(id, expires)``; one that opens none gets the gateway's
    (its id is then ``session_id`` on the session's later requests). ``close_session()``
    ends the request's session.

    Cancellation: ``cancelled`` becomes True once the gateway's connection for this
    request is lost (its client went away, and the gateway closed its exchange), so that
    a handler working long (a loop of steps, a generator between items) can stop making
    an answer nobody will read. Only a handler on a handler thread
    (``SAGEMAKER_MODEL_SERVER_WORKERS`` above 1) is told while it runs: one run inline
    holds the event loop that would see the connection go, and reads False throughout.
    """

    __slots__ = (
        "request_custom_attributes",
        "response_custom_attributes",
        "adapter",
        "session_id",
        "new_session",
        "closed_session",
        "_lost",
    )

    def __init__(
        self,
        request_custom_attributes: str | None = None,
        adapter: str | None = None,
        session_id: str | None = None,
    ) -> None:
        self.request_custom_attributes = request_custom_attributes
        self.response_custom_attributes: str | None = None
        self.adapter = adapter
        self.session_id = session_id
        self.new_session: str | None = None
        """The New-Session-Id header's value ``open_session`` set, if any."""
        self.closed_session: str | None = None
        """The session ``close_session`` closed, if any."""
        self._lost = _NEVER_LOST
        """Set once the request's connection is lost, when the runtime watches it
        (``watch_loss``); the shared, never-set event when it does not."""

    @property
    def cancelled(self) -> bool:
        """Whether the gateway's connection for this request was lost while the handlers
        ran (its client left): nobody will read the answer. A thread-safe read, cheap
        enough to check every few milliseconds; always False for a handler run inline."""
        return self._lost.is_set()

    def open_session(self, session_id: str, expires: datetime | float | None = None) -> None:
        """Answer this NEW_SESSION request by opening session ``session_id`` (letters,
        digits and single hyphens, at most 256 characters), lasting until ``expires``: a
        datetime (UTC unless it says otherwise) or Unix time, which the gateway cuts to
        ``SHIPYARD_SESSION_MAX_TTL_S`` from now; None, the gateway's default
        (``SHIPYARD_SESSION_TTL_S``). The gateway reads it only on a NEW_SESSION."""
        if len(session_id) > _MAX_SESSION_ID or not _SESSION_ID.fullmatch(session_id):
            raise ValueError(f"not a session id: {session_id[:300]!r}")
        if expires is None:
            self.new_session = session_id
            return
        if not isinstance(expires, datetime):
            expires = datetime.fromtimestamp(expires, UTC)
        elif expires.tzinfo is None:
            expires = expires.replace(tzinfo=UTC)
        at = expires.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.new_session = f"{session_id}; Expires={at}"

    def close_session(self) -> None:
        """End the request's session (answered to the gateway, which refuses its id from
        then on)."""
        if self.session_id is None or self.session_id == "NEW_SESSION":
            raise ValueError("this request belongs to no session to close")
        self.closed_session = self.session_id

    def __repr__(self) -> str:
        return (
            f"Context(request_custom_attributes={self.request_custom_attributes!r}, "
            f"response_custom_attributes={self.response_custom_attributes!r}, "
            f"adapter={self.adapter!r}, session_id={self.session_id!r})"
        )


class Handlers:
    """The user's handlers, or the defaults, bound to one loaded model."""

    def __init__(self, *, model: Any, module: ModuleType | None) -> None:
        self.model = model
        self.program = module.__name__ if module is not None else None
        self._transform = _find(module, "transform_fn")
        self._input: Handler = _find(module, "input_fn") or codecs.decode
        self._predict: Handler = _find(module, "predict_fn") or _default_predict
        self._output: Handler = _find(module, "output_fn") or codecs.encode
        self._predict_tensors = _find(module, "predict_tensors_fn")
        self._predict_batch = _find(module, "predict_batch_fn")
        self.stream: Handler | None = _find(module, "stream_fn")
        """``stream_fn(parts, model)``, for bidirectional streams (:mod:`bidi`); None:
        the model cannot stream."""
        self.module = module
        self._transform_ctx = _takes_context(self._transform)
        self._input_ctx = _takes_context(self._input)
        self._predict_ctx = _takes_context(self._predict)
        self._output_ctx = _takes_context(self._output)
        self.uses_context = self._transform_ctx or (
            self._transform is None and (self._input_ctx or self._predict_ctx or self._output_ctx)
        )
        """Whether any handler a request calls takes ``context``; else none is built."""
        self.batcher: Batcher | None = None
        """On a multi-model instance with batching on, this model's own batcher, made at
        its first request and dropped with it when it is unloaded."""

    def __repr__(self) -> str:
        return f"Handlers(program={self.program!r}, model={type(self.model).__name__})"

    @property
    def batches(self) -> bool:
        """Whether the program can be batched: it defines ``predict_batch_fn`` and its
        requests go through ``input_fn``/``output_fn`` (no ``transform_fn``)."""
        return self._predict_batch is not None and self._transform is None

    def batchable(self, content_type: str) -> bool:
        """Whether a request of this type goes into a batch: OIP tensors go to
        ``predict_tensors_fn`` on their own when the program defines it."""
        return self._predict_tensors is None or not content_type.startswith(codecs.TENSORS)

    def invoke_batch(self, requests: Sequence[Request]) -> list[tuple[bytes, str] | Exception]:
        """Run requests gathered by the batcher through one ``predict_batch_fn`` call.

        Each answer is a response body and its content type, or the exception that failed
        that request alone (its ``input_fn``, its item of the batch or its ``output_fn``).
        Raises when ``predict_batch_fn`` raises or does not answer one item per request:
        then every request of the batch fails.
        """
        predict_batch = self._predict_batch
        assert predict_batch is not None, "only a program that batches is batched"
        answers: list[tuple[bytes, str] | Exception] = []
        inputs: list[Any] = []
        for body, content_type, _, context in requests:
            try:
                inputs.append(self._decode_one(body, content_type, context))
                answers.append(_PENDING)
            except Exception as exc:
                answers.append(exc)
        predictions = predict_batch(inputs, self.model) if inputs else []
        if not isinstance(predictions, Sequence) or len(predictions) != len(inputs):
            got = len(predictions) if isinstance(predictions, Sized) else type(predictions)
            raise TypeError(
                f"predict_batch_fn returned {got!s} predictions for {len(inputs)} inputs; "
                "it must return a list with one prediction (or Exception) per input, in order."
            )
        position = 0
        for n, (_, _, accept, context) in enumerate(requests):
            if answers[n] is not _PENDING:
                continue
            prediction = predictions[position]
            position += 1
            if isinstance(prediction, Exception):
                answers[n] = prediction
                continue
            try:
                if self._output_ctx:
                    result = self._output(prediction, accept, context=context)
                else:
                    result = self._output(prediction, accept)
                answers[n] = _as_response(result, accept, "output_fn")
            except Exception as exc:
                answers[n] = exc
        return answers

    def _decode_one(self, body: bytes, content_type: str, context: Context | None) -> Any:
        received: Any = body
        if content_type.startswith(codecs.TENSORS):
            received, content_type = codecs.decode_tensors(body, content_type), codecs.TENSORS
        if self._input_ctx:
            return self._input(received, content_type, context=context)
        return self._input(received, content_type)

    def invoke(
        self, body: bytes, content_type: str, accept: str, context: Context | None
    ) -> tuple[bytes, str]:
        """Run one request through the handlers: the response body and its content type
        (a streamed answer joined whole)."""
        payload, media_type = self.answer(body, content_type, accept, context)
        if not isinstance(payload, bytes):
            payload = streaming.join(payload)
        return payload, media_type

    def answer(
        self, body: bytes, content_type: str, accept: str, context: Context | None
    ) -> tuple[bytes | streaming.Chunks, str]:
        """As ``invoke``, but a handler's iterator comes back as an iterator of chunks,
        still to be run (see :mod:`streaming`)."""
        model = self.model
        received: Any = body
        if content_type.startswith(codecs.TENSORS):
            received, content_type = codecs.decode_tensors(body, content_type), codecs.TENSORS
            if self._predict_tensors is not None:
                return codecs.encode_tensors(self._predict_tensors(received, model))
        if self._transform is not None:
            if self._transform_ctx:
                result = self._transform(model, received, content_type, accept, context=context)
            else:
                result = self._transform(model, received, content_type, accept)
            return _as_answer(result, accept, "transform_fn")
        if self._input_ctx:
            data = self._input(received, content_type, context=context)
        else:
            data = self._input(received, content_type)
        if self._predict_ctx:
            prediction = self._predict(data, model, context=context)
        else:
            prediction = self._predict(data, model)
        if self._output is codecs.encode and streaming.is_stream(prediction):
            return streaming.encoded(prediction, accept), accept
        if self._output_ctx:
            result = self._output(prediction, accept, context=context)
        else:
            result = self._output(prediction, accept)
        return _as_answer(result, accept, "output_fn")


def load(model_dir: Path, *, program: str | None = None, code_dir: Path | None = None) -> Handlers:
    """Import the user's program from ``model_dir/code`` and call its ``model_fn``.

    ``program`` is ``SAGEMAKER_PROGRAM``; when it is not given, a missing ``inference.py``
    means "all defaults", but a program named explicitly must exist. ``code_dir`` replaces
    ``model_dir/code``: the fetched ``SAGEMAKER_SUBMIT_DIRECTORY`` of a framework model.
    Errors from the user's module or ``model_fn`` propagate unchanged: their type and
    message are what the endpoint's FailureReason shows.
    """
    if not model_dir.is_dir():
        raise FileNotFoundError(f"The model directory {model_dir} does not exist.")
    submitted = code_dir is not None
    code_dir = code_dir or model_dir / "code"
    path = code_dir / (program or DEFAULT_PROGRAM)
    module: ModuleType | None = None
    if path.is_file():
        module = _import(path, code_dir)
    elif program is not None:
        where = "SAGEMAKER_SUBMIT_DIRECTORY" if submitted else "the model's code/ folder"
        raise FileNotFoundError(f"SAGEMAKER_PROGRAM {program} is not in {where} ({code_dir}).")
    # The base model of a program whose model_fn takes adapters: with no adapter, or
    # None where that parameter has no default.
    adapter = _adapter_parameter(module)
    required = (
        adapter is not None
        and adapter.default is inspect.Parameter.empty
        and adapter.kind is not inspect.Parameter.VAR_POSITIONAL
    )
    base = (None,) if required else ()
    return Handlers(model=call_model_fn(module, model_dir, *base), module=module)


def call_model_fn(module: ModuleType | None, model_dir: Path, *extra: str | None) -> Any:
    """``model_fn(model_dir, *extra)`` of ``module``; None when it has none."""
    model_fn = _find(module, "model_fn")
    if model_fn is None:
        return None
    if _takes_context(model_fn):
        return model_fn(str(model_dir), *extra, context=Context())
    return model_fn(str(model_dir), *extra)


def takes_adapter_dir(module: ModuleType | None) -> bool:
    """Whether the program's ``model_fn`` takes a second positional argument (an
    adapter's folder)."""
    return _adapter_parameter(module) is not None


def _adapter_parameter(module: ModuleType | None) -> inspect.Parameter | None:
    model_fn = _find(module, "model_fn")
    if model_fn is None:
        return None
    try:
        parameters = list(inspect.signature(model_fn).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [
        p
        for p in parameters
        if p.kind
        in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.VAR_POSITIONAL,
        )
        and p.name != "context"
    ]
    return positional[1] if len(positional) >= 2 else None


def _import(path: Path, code_dir: Path) -> ModuleType:
    # Imported under its own name and with code/ on sys.path, as the toolkit does, so the
    # program can import its sibling modules and pickles that name its classes load.
    sys.path.insert(0, str(code_dir))
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"Cannot import {path}: not a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _find(module: ModuleType | None, name: str) -> Handler | None:
    if module is None:
        return None
    handler = getattr(module, name, None)
    if handler is not None and not callable(handler):
        raise TypeError(f"{name} in {module.__name__} is not a function.")
    return handler


def _takes_context(handler: Handler | None) -> bool:
    if handler is None:
        return False
    try:
        parameters = inspect.signature(handler).parameters
    except (TypeError, ValueError):  # some builtins have no signature
        return False
    parameter = parameters.get("context")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _default_predict(data: Any, model: Any) -> Any:
    predict = getattr(model, "predict", None)
    if callable(predict):
        return predict(data)
    if callable(model):
        return model(data)
    return data


def _as_answer(result: Any, accept: str, handler: str) -> tuple[bytes | streaming.Chunks, str]:
    """As _as_response, and an iterator (or ``(iterator, content_type)``) as its chunks."""
    pair = isinstance(result, tuple) and len(result) == 2
    body, content_type = result if pair else (result, accept)
    if streaming.is_stream(body) and isinstance(content_type, str):
        return streaming.chunks(body, handler), content_type
    return _as_response(result, accept, handler)


def _as_response(result: Any, accept: str, handler: str) -> tuple[bytes, str]:
    if isinstance(result, tuple):
        if len(result) != 2 or not isinstance(result[1], str):
            raise TypeError(f"{handler} returned a tuple that is not (body, content_type).")
        body, content_type = result
    else:
        body, content_type = result, accept
    if isinstance(body, bytes):
        return body, content_type
    if isinstance(body, str):
        return body.encode(), content_type
    if isinstance(body, bytearray | memoryview):
        return bytes(body), content_type
    raise TypeError(
        f"{handler} returned {type(body).__name__}; expected bytes, str or (body, content_type)."
    )
