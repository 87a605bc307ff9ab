"""Default ``input_fn`` and ``output_fn``: JSON, CSV and NPY, as the SageMaker toolkit has.

These run when ``inference.py`` does not define its own.

Decoding (``Content-Type``, parameters such as ``; charset=utf-8`` ignored):

- ``application/json``: ``json.loads(body)``: lists, dicts and numbers as they are.
- ``text/csv``: a 2-D float ``numpy`` array, one row per line.
- ``application/x-npy``: ``numpy.load(allow_pickle=False)``; pickled object arrays are
  refused, since a request body is untrusted input.

Encoding (``Accept``; a list is read left to right and the first type we know wins;
``*/*`` means JSON):

- ``application/json``: ``json.dumps``; numpy arrays and scalars become lists and
  numbers, and a ``{"predictions": ...}`` dict stays as it is.
- ``text/csv``: one line per row of a 2-D result, one line per value of a 1-D one.
- ``application/x-npy``: ``numpy.save`` bytes.

Open Inference Protocol tensors (``application/vnd.shipyard.v2+tensors``, the gateway's
wire format, :mod:`shipyard.tensors`) arrive already decoded: :func:`decode_tensors` turns
the body into a ``dict`` of numpy arrays before any handler runs, and ``decode`` hands
that dict on. ``encode`` writes a dict of arrays (or one array, named ``output0``) back
in the wire format, every output binary.

numpy is imported only when a CSV, NPY or tensors body is seen: JSON is the common case and
numpy's import would add a tenth of a second to every instance start.

Errors carry ``status_code`` (415, 406 or 400) so the server answers with it; they cross
to the gateway only as a status and a ``<ExcType>: <message>`` line.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from shipyard.errors import InvalidBody, TensorError, UnsupportedAccept, UnsupportedContentType

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
TENSORS = "application/vnd.shipyard.v2+tensors"
SUPPORTED = (JSON, CSV, NPY)


def media_type(value: str) -> str:
    """``value`` without parameters, lower-cased: ``Text/CSV; charset=utf-8`` → ``text/csv``."""
    return value.split(";", 1)[0].strip().lower()


def decode(body: bytes, content_type: str) -> Any:
    """The default ``input_fn``: the body as a Python or numpy value."""
    if isinstance(body, dict):  # tensors, decoded by decode_tensors
        return body
    kind = content_type if content_type in SUPPORTED else media_type(content_type)
    if kind == JSON:
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:  # bad JSON or bytes, or nested too deep
            raise InvalidBody(f"The body is not valid JSON: {exc}") from exc
    if kind == CSV:
        return _decode_csv(body)
    if kind == NPY:
        return _decode_npy(body)
    raise UnsupportedContentType(
        f"Content type {content_type!r} is not supported by the default input_fn; "
        f"use one of {', '.join(SUPPORTED)} or define input_fn in inference.py."
    )


def encode(prediction: Any, accept: str) -> tuple[bytes, str]:
    """The default ``output_fn``: ``prediction`` as bytes, and their content type."""
    if accept == TENSORS:
        return encode_tensors(prediction)
    kind = accept if accept in SUPPORTED else _choose(accept)
    if kind == JSON:
        return _JSON_ENCODER.encode(prediction).encode(), JSON
    if kind == CSV:
        return _encode_csv(prediction), CSV
    return _encode_npy(prediction), NPY


def _choose(accept: str) -> str:
    for part in accept.split(","):
        kind = media_type(part)
        if kind in SUPPORTED:
            return kind
        if kind in ("*/*", "application/*", ""):
            return JSON
    raise UnsupportedAccept(
        f"Accept {accept!r} is not supported by the default output_fn; "
        f"use one of {', '.join(SUPPORTED)} or define output_fn in inference.py."
    )


def decode_tensors(body: bytes, content_type: str) -> dict[str, Any]:
    """A wire-format body as ``{input name: numpy array}``."""
    from shipyard import tensors

    try:
        length = tensors.header_length_of(content_type, None)
        request = tensors.parse_request(body, length)
    except TensorError as exc:
        raise InvalidBody(str(exc)) from exc
    return {t.name: tensors.to_numpy(t) for t in request.inputs}


def encode_tensors(prediction: Any) -> tuple[bytes, str]:
    """A dict of arrays (or one array, as ``output0``) in the wire format."""
    from shipyard import tensors

    if not isinstance(prediction, dict):
        prediction = {"output0": prediction}
    outputs = [tensors.from_numpy(str(name), value) for name, value in prediction.items()]
    body, length = tensors.encode_binary(outputs, "outputs")
    return body, f"{TENSORS}; header-length={length}"


def _jsonable(value: Any) -> Any:
    # numpy arrays and scalars (and torch tensors) all have tolist(); this runs only for
    # objects json cannot encode itself, so plain lists and dicts pay nothing.
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# One encoder for the process: json.dumps(default=...) would build a new one per call.
_JSON_ENCODER = json.JSONEncoder(default=_jsonable)


def _decode_csv(body: bytes) -> Any:
    import numpy as np

    try:
        lines = [line for line in body.decode().splitlines() if line.strip()]
        if not lines:
            raise InvalidBody("The CSV body has no rows.")
        return np.loadtxt(lines, delimiter=",", quotechar='"', dtype=float, ndmin=2)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidBody(f"The body is not CSV of numbers: {exc}") from exc


def _decode_npy(body: bytes) -> Any:
    import numpy as np

    try:
        return np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InvalidBody(f"The body is not a NPY array: {exc}") from exc


def _encode_csv(prediction: Any) -> bytes:
    rows = prediction.tolist() if callable(getattr(prediction, "tolist", None)) else prediction
    if not isinstance(rows, list | tuple):
        rows = [[rows]]
    else:
        rows = [row if isinstance(row, list | tuple) else [row] for row in rows]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def _encode_npy(prediction: Any) -> bytes:
    import numpy as np

    out = io.BytesIO()
    np.save(out, np.asarray(prediction), allow_pickle=False)
    return out.getvalue()
