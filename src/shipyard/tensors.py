"""Tensors of the Open Inference Protocol v2 (KServe / Triton), and how they cross to an
instance.

Three forms of the same tensors meet here:

- the REST body a client sends: a JSON header whose inputs carry ``data`` as JSON, or
  ``parameters.binary_data_size`` bytes appended after the header (the binary tensor
  extension, the header's length in ``Inference-Header-Content-Length``);
- the gRPC ``ModelInferRequest`` (gateway/doors/oip/grpc.py turns it into :class:`Tensor`);
- the **wire format** between the gateway and an instance: always the binary form, every
  tensor's bytes after the JSON header, sent to ``POST /invocations`` with
  ``Content-Type: application/vnd.shipyard.v2+tensors; header-length=N`` and the same
  ``N`` in ``Inference-Header-Content-Length``. The instance answers in the same form
  with every output binary; the gateway then gives each client the outputs it asked for,
  in the form it asked for (JSON data, binary, or gRPC raw contents).

Every tensor is checked once, at the gateway, as it is turned into a :class:`Tensor`
(datatype known, shape of non-negative ints, as many elements as the shape says, values
that fit the datatype): a :class:`TensorError` there is the client's mistake (400). The
same parser reads the instance's answer, where an error is the model's (424).

The framing is ours to write by hand: it is a header and byte slicing, and the libraries
that know it (tritonclient, mlserver) are clients or whole servers, not codecs.
Raw bytes are little-endian, row-major; a ``BYTES`` element is a 4-byte little-endian
length and then that many bytes, as Triton lays them out in both REST and gRPC.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shipyard.errors import TensorError

if TYPE_CHECKING:
    import numpy as np

TENSORS = "application/vnd.shipyard.v2+tensors"
"""The content type of the wire format, both ways."""
HEADER_LENGTH = "Inference-Header-Content-Length"
"""The REST binary extension's header: how many bytes of the body are the JSON header."""

DTYPES: dict[str, str] = {
    "BOOL": "?",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
    "BYTES": "O",
}
"""Every datatype we take, and its numpy dtype's code (BF16 has none in numpy: refused).

numpy is imported by the functions that use it, not here: the gateway imports this
module for its OIP doors, and numpy's import is a tenth of a gateway's start, paid only
by a gateway that is sent a tensor. The doors await :func:`numpy_imported` first, so
that import runs beside the event loop rather than on it."""

_ITEMSIZE = {datatype: int(code[2:] or 1) for datatype, code in DTYPES.items() if code != "O"}
"""The bytes an element of each fixed-size datatype takes."""

_numpy: asyncio.Task[Any] | None = None


async def numpy_imported() -> None:
    """numpy imported, in a worker thread: the first tensor's request waits for it (a
    fifth of a second), the gateway's other requests do not."""
    global _numpy
    if _numpy is not None and _numpy.done():
        return
    loop = asyncio.get_running_loop()
    if _numpy is None or _numpy.get_loop() is not loop:
        _numpy = loop.create_task(asyncio.to_thread(importlib.import_module, "numpy"))
    await asyncio.shield(_numpy)


# The numpy kinds of JSON data that fit each family of datatype: [1.5] is no INT32.
_KINDS = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}
_LENGTH = struct.Struct("<I")


@dataclass(slots=True)
class Tensor:
    """One named tensor: its datatype, shape and raw bytes (see the module docstring)."""

    name: str
    datatype: str
    shape: list[int]
    raw: bytes

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.datatype}, {self.shape}, {len(self.raw)} bytes)"


@dataclass(slots=True)
class InferRequest:
    """An inference request, whichever door it came in by."""

    inputs: list[Tensor]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[tuple[str, bool | None]] | None = None
    """The outputs asked for, each with its own ``binary_data`` choice; None: all."""

    @property
    def binary_output(self) -> bool:
        """``parameters.binary_data_output``: every output binary unless it says otherwise."""
        return self.parameters.get("binary_data_output") is True


# -- parsing ---------------------------------------------------------------------------


def parse_request(body: bytes, header_length: int | None) -> InferRequest:
    """A REST inference request (JSON, or the binary extension), every input checked."""
    header, tail = _split(body, header_length, strict=True)
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise TensorError("The request has no 'inputs': give a list of input tensors.")
    parameters = header.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise TensorError("The request's 'parameters' is not an object.")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise TensorError("The request's 'id' is not a string.")
    return InferRequest(
        inputs=_tensors(inputs, tail, "input"),
        id=request_id,
        parameters=parameters,
        outputs=_requested(header.get("outputs")),
    )


def parse_response(body: bytes, header_length: int | None) -> list[Tensor]:
    """The outputs of an inference response (an instance's answer)."""
    header, tail = _split(body, header_length)
    outputs = header.get("outputs")
    if not isinstance(outputs, list):
        raise TensorError("The answer has no 'outputs' list.")
    return _tensors(outputs, tail, "output")


def header_length_of(content_type: str | None, header: str | None) -> int | None:
    """The JSON header's length, from the content type's ``header-length`` parameter or
    the ``Inference-Header-Content-Length`` header; None when the body is all JSON."""
    value = header
    if value is None and content_type is not None and ";" in content_type:
        for part in content_type.split(";")[1:]:
            key, _, number = part.partition("=")
            if key.strip().lower() == "header-length":
                value = number
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise TensorError(f"{HEADER_LENGTH} {value!r} is not a number.") from None
    if length < 0:
        raise TensorError(f"{HEADER_LENGTH} {length} is negative.")
    return length


def _not_json(literal: str) -> Any:
    """Python's json reads NaN and Infinity, which JSON (RFC 8259) has not."""
    raise ValueError(f"{literal} is not JSON")


def _finite(text: str) -> float:
    """A JSON number as Python reads it, unless it is past any float (1e400: inf)."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is past the range of any float")
    return value


def _split(
    body: bytes, header_length: int | None, *, strict: bool = False
) -> tuple[dict[str, Any], memoryview]:
    """The JSON header and the binary data after it. ``strict`` (a client's request):
    JSON as RFC 8259 has it, no NaN or Infinity, no number past any float. A model's
    answer is read as Python's json reads it: a model in Python writes NaN so."""
    if header_length is None:
        header_length = len(body)
    elif header_length > len(body):
        raise TensorError(
            f"{HEADER_LENGTH} is {header_length}, but the body has only {len(body)} bytes."
        )
    try:
        text = body[:header_length]
        header = (
            json.loads(text, parse_constant=_not_json, parse_float=_finite)
            if strict
            else json.loads(text)
        )
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise TensorError(f"The JSON header does not parse: {exc}") from None
    if not isinstance(header, dict):
        raise TensorError("The JSON header is not an object.")
    return header, memoryview(body)[header_length:]


def _requested(outputs: Any) -> list[tuple[str, bool | None]] | None:
    if outputs is None:
        return None
    if not isinstance(outputs, list):
        raise TensorError("The request's 'outputs' is not a list.")
    asked: list[tuple[str, bool | None]] = []
    for output in outputs:
        name = output.get("name") if isinstance(output, dict) else None
        if not isinstance(name, str):
            raise TensorError("An entry of 'outputs' has no 'name'.")
        parameters = output.get("parameters") or {}
        binary = parameters.get("binary_data") if isinstance(parameters, dict) else None
        asked.append((name, binary if isinstance(binary, bool) else None))
    return asked


def check_named(kind: str, name: Any, datatype: Any) -> tuple[str, str]:
    """A tensor's (an ``kind``'s: input, output) name and datatype, or TensorError when it
    has no name or a datatype the protocol has not: what REST and gRPC both check
    before anything is sent."""
    if not isinstance(name, str) or not name:
        raise TensorError(f"An {kind} has no 'name'.")
    if datatype not in DTYPES:
        raise TensorError(
            f"{kind.capitalize()} '{name}' has datatype {datatype!r}; "
            f"use one of {', '.join(DTYPES)}."
        )
    return name, datatype


def _tensors(entries: list[Any], tail: memoryview, kind: str) -> list[Tensor]:
    tensors: list[Tensor] = []
    offset = 0
    for entry in entries:
        if not isinstance(entry, dict):
            raise TensorError(f"An {kind} is not an object.")
        name, datatype = check_named(kind, entry.get("name"), entry.get("datatype"))
        shape = check_shape(name, entry.get("shape"))
        parameters = entry.get("parameters") or {}
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        if size is not None:
            if type(size) is not int or size < 0 or offset + size > len(tail):
                raise TensorError(
                    f"{kind.capitalize()} '{name}' says binary_data_size {size!r}, "
                    f"but {len(tail) - offset} bytes of binary data are left."
                )
            raw = bytes(tail[offset : offset + size])
            offset += size
            check_raw(name, datatype, shape, raw)
        elif "data" in entry:
            raw = json_to_raw(name, datatype, shape, entry["data"])
        else:
            raise TensorError(f"{kind.capitalize()} '{name}' has neither 'data' nor binary data.")
        tensors.append(Tensor(name, datatype, shape, raw))
    if offset != len(tail):
        raise TensorError(
            f"{len(tail) - offset} bytes of binary data follow the JSON header that no "
            f"{kind}'s binary_data_size accounts for."
        )
    return tensors


MAX_DIMS = 32
"""The most dimensions a shape may have (numpy 1's limit; numpy 2's is 64)."""
_MAX_ELEMENTS = 2**59
"""The most elements a shape may hold: past that numpy cannot make even an empty array of
it (its byte size overflows), so the instance could only fail on it."""


def check_shape(name: str, shape: Any) -> list[int]:
    """``shape`` if it is a list of at most MAX_DIMS sizes >= 0 that numpy can hold.

    Checked in time linear in its length, the product of its sizes kept small: a shape of
    many huge sizes would otherwise hold the event loop multiplying big integers."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise TensorError(f"Tensor '{name}' needs a shape of at most {MAX_DIMS} sizes >= 0.")
    elements = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise TensorError(f"Tensor '{name}' has a shape that is not a list of sizes >= 0.")
        elements *= dim or 1  # an empty dimension makes no array too large
        if elements > _MAX_ELEMENTS:
            raise TensorError(f"Tensor '{name}' has a shape of more than 2**59 elements.")
    return shape


def check_raw(name: str, datatype: str, shape: list[int], raw: bytes) -> None:
    """Raw bytes that hold exactly the elements ``shape`` says, or TensorError."""
    count = math.prod(shape)
    if datatype == "BYTES":
        found = len(_split_bytes(name, raw))
        if found != count:
            raise TensorError(
                f"Tensor '{name}' has {found} BYTES elements, but shape {shape} needs {count}."
            )
        return
    expected = count * _ITEMSIZE[datatype]
    if len(raw) != expected:
        raise TensorError(
            f"Tensor '{name}' has {len(raw)} bytes of {datatype} data, but shape {shape} "
            f"needs {expected}."
        )


def json_to_raw(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    """JSON ``data`` (flat or nested, as the protocol allows) as raw bytes, checked."""
    count = math.prod(shape)
    if datatype == "BYTES":
        items = list(_flatten(data))
        if len(items) != count:
            raise TensorError(
                f"Tensor '{name}' has {len(items)} elements in 'data', but shape {shape} "
                f"needs {count}."
            )
        if not all(isinstance(item, str) for item in items):
            raise TensorError(f"Tensor '{name}' is BYTES: give its 'data' as strings.")
        return serialize_bytes(item.encode() for item in items)
    import numpy as np

    dtype = np.dtype(DTYPES[datatype])
    try:
        array = np.asarray(data)
    except ValueError as exc:
        raise TensorError(f"Tensor '{name}' has 'data' that is no regular array: {exc}") from None
    if array.size != count:
        raise TensorError(
            f"Tensor '{name}' has {array.size} elements in 'data', but shape {shape} needs {count}."
        )
    if count and array.dtype.kind not in _KINDS[dtype.kind]:
        raise TensorError(f"Tensor '{name}' is {datatype}, but its 'data' are not all {datatype}.")
    if count and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise TensorError(f"Tensor '{name}' has 'data' out of the range of {datatype}.")
    with np.errstate(over="ignore"):  # an overflow is found below, and refused
        converted = array.astype(dtype, copy=False)
    if count and dtype.kind == "f" and not np.isfinite(converted).all():
        # A finite number past the type's range (1e39 as FP32) is refused, as integers
        # out of range are; NaN and infinities given as such (gRPC's IEEE floats) stay.
        overflowed = np.isfinite(array.astype(np.float64)) & ~np.isfinite(converted)
        if overflowed.any():
            raise TensorError(f"Tensor '{name}' has 'data' out of the range of {datatype}.")
    return converted.tobytes()


def _flatten(data: Any) -> Iterable[Any]:
    if isinstance(data, list):
        for item in data:
            yield from _flatten(item)
    else:
        yield data


def _split_bytes(name: str, raw: bytes) -> list[bytes]:
    items: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise TensorError(f"Tensor '{name}' has BYTES data cut inside an element's length.")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise TensorError(f"Tensor '{name}' has a BYTES element longer than its data.")
        items.append(raw[offset : offset + length])
        offset += length
    return items


def serialize_bytes(items: Iterable[bytes]) -> bytes:
    """BYTES elements in their raw layout: each a 4-byte little-endian length, then it."""
    parts: list[bytes] = []
    for item in items:
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


# -- writing ---------------------------------------------------------------------------


def encode_binary(
    tensors: list[Tensor], kind: str, extra: Mapping[str, Any] | None = None
) -> tuple[bytes, int]:
    """Tensors in the binary form: the body and its JSON header's length.

    ``kind`` is ``inputs`` or ``outputs``; ``extra`` adds fields to the header.
    """
    header: dict[str, Any] = dict(extra or {})
    header[kind] = [
        {
            "name": t.name,
            "datatype": t.datatype,
            "shape": t.shape,
            "parameters": {"binary_data_size": len(t.raw)},
        }
        for t in tensors
    ]
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([head, *(t.raw for t in tensors)]), len(head)


def wire_request(request: InferRequest) -> tuple[bytes, int]:
    """The wire format of ``request``, for an instance: body and header length."""
    extra: dict[str, Any] = {}
    if request.id is not None:
        extra["id"] = request.id
    if request.parameters:
        extra["parameters"] = request.parameters
    if request.outputs is not None:
        extra["outputs"] = [{"name": name} for name, _ in request.outputs]
    return encode_binary(request.inputs, "inputs", extra)


def select_outputs(request: InferRequest, outputs: list[Tensor]) -> list[tuple[Tensor, bool]]:
    """The outputs the request asked for (all when it named none), each with whether it
    goes back binary; an output asked for and not produced is the request's mistake."""
    default = request.binary_output
    if request.outputs is None:
        return [(t, default) for t in outputs]
    by_name = {t.name: t for t in outputs}
    chosen: list[tuple[Tensor, bool]] = []
    for name, binary in request.outputs:
        tensor = by_name.get(name)
        if tensor is None:
            raise TensorError(
                f"The model has no output '{name}'; it gave {', '.join(by_name) or 'none'}."
            )
        chosen.append((tensor, default if binary is None else binary))
    return chosen


def rest_response(
    header: dict[str, Any], chosen: list[tuple[Tensor, bool]]
) -> tuple[bytes, int | None]:
    """A REST inference response: the body, and the header's length when some output is
    binary (None: the body is all JSON)."""
    entries: list[dict[str, Any]] = []
    raws: list[bytes] = []
    for tensor, binary in chosen:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": tensor.shape,
        }
        if binary:
            entry["parameters"] = {"binary_data_size": len(tensor.raw)}
            raws.append(tensor.raw)
        else:
            entry["data"] = raw_to_json(tensor)
        entries.append(entry)
    header = {**header, "outputs": entries}
    head = json.dumps(header, separators=(",", ":")).encode()
    if not raws:
        return head, None
    return b"".join([head, *raws]), len(head)


def raw_to_json(tensor: Tensor) -> list[Any]:
    """The tensor's elements as a flat JSON list (BYTES as UTF-8 strings)."""
    if tensor.datatype == "BYTES":
        return [item.decode(errors="replace") for item in _split_bytes(tensor.name, tensor.raw)]
    import numpy as np

    values: list[Any] = np.frombuffer(tensor.raw, dtype=DTYPES[tensor.datatype]).tolist()
    return values


# -- numpy, for the runtime ------------------------------------------------------------


def to_numpy(tensor: Tensor) -> np.ndarray[Any, Any]:
    """The tensor as a numpy array of its shape (BYTES: an object array of bytes)."""
    import numpy as np

    if tensor.datatype == "BYTES":
        items = _split_bytes(tensor.name, tensor.raw)
        array = np.empty(len(items), dtype=object)
        array[:] = items
        return array.reshape(tensor.shape)
    return np.frombuffer(tensor.raw, dtype=DTYPES[tensor.datatype]).reshape(tensor.shape)


def from_numpy(name: str, value: Any) -> Tensor:
    """A model's output as a tensor: numeric and bool arrays keep their type; strings and
    bytes become BYTES."""
    import numpy as np

    array = np.asarray(value)
    kind = array.dtype.kind
    shape = list(array.shape)
    if kind in "OSU":
        items = (item if isinstance(item, bytes) else str(item).encode() for item in array.ravel())
        return Tensor(name, "BYTES", shape, serialize_bytes(items))
    for datatype, code in DTYPES.items():
        dtype = np.dtype(code)
        if dtype.kind == kind and dtype.itemsize == array.dtype.itemsize:
            raw = array.astype(dtype, copy=False).tobytes()
            return Tensor(name, datatype, shape, raw)
    raise TypeError(f"Output '{name}' has numpy dtype {array.dtype}, which no v2 datatype holds.")
