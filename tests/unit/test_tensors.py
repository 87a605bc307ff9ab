"""The Open Inference Protocol's tensors: parsing, checking and the wire format."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from shipyard.errors import InvalidBody, TensorError
from shipyard.runtime import codecs
from shipyard.tensors import (
    InferRequest,
    Tensor,
    encode_binary,
    from_numpy,
    header_length_of,
    json_to_raw,
    parse_request,
    parse_response,
    rest_response,
    select_outputs,
    to_numpy,
    wire_request,
)


def _json(*inputs: dict[str, object], **extra: object) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def test_json_and_binary_tensors_parse_to_the_same_bytes() -> None:
    data = [[1, 2, 3], [4, 5, 6]]
    nested = parse_request(
        _json({"name": "x", "datatype": "INT32", "shape": [2, 3], "data": data}), None
    )
    raw = np.asarray(data, dtype="<i4").tobytes()
    head = _json(
        {"name": "x", "datatype": "INT32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}
    )
    binary = parse_request(head + raw, len(head))
    assert nested.inputs[0].raw == binary.inputs[0].raw == raw


@pytest.mark.parametrize(
    ("tensor", "words"),
    [
        ({"datatype": "INT32", "shape": [3], "data": [1, 2]}, r"shape \[3\] needs 3"),
        ({"datatype": "INT32", "shape": [2], "data": [1.5, 2]}, "not all INT32"),
        ({"datatype": "UINT8", "shape": [1], "data": [256]}, "out of the range"),
        ({"datatype": "BF16", "shape": [1], "data": [1]}, "datatype 'BF16'"),
        ({"datatype": "FP32", "shape": [-1], "data": [1]}, "sizes >= 0"),
        ({"datatype": "BYTES", "shape": [1], "data": [1]}, "as strings"),
        ({"datatype": "FP32", "shape": [1]}, "neither 'data'"),
        ({"datatype": "INT32", "shape": [1] * 33, "data": [1]}, "at most 32 sizes"),
        ({"datatype": "INT32", "shape": [2**62] * 60_000, "data": [1]}, "at most 32 sizes"),
        ({"datatype": "INT32", "shape": [0, 2**40, 2**40], "data": []}, "more than 2..59"),
        ({"datatype": "INT32", "shape": [10**3000], "data": [1]}, "more than 2..59"),
        ({"datatype": "INT32", "shape": [1.0], "data": [1]}, "sizes >= 0"),
        ({"datatype": "FP32", "shape": [2], "data": [1e39, 1]}, "out of the range of FP32"),
        ({"datatype": "FP16", "shape": [1], "data": [1e10]}, "out of the range of FP16"),
    ],
    ids=[
        "count",
        "fraction",
        "range",
        "bf16",
        "negative",
        "bytes",
        "no-data",
        "33-dims",
        "many-huge-dims",
        "too-many-elements",
        "a-huge-size",
        "a-float-size",
        "fp32-range",
        "fp16-range",
    ],
)
def test_malformed_tensors_are_refused_with_a_reason(tensor: dict[str, object], words: str) -> None:
    with pytest.raises(TensorError, match=words):
        parse_request(_json({"name": "x", **tensor}), None)


def test_binary_sizes_must_add_up() -> None:
    head = _json(
        {"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
    )
    with pytest.raises(TensorError, match="bytes of binary data are left"):
        parse_request(head + b"\0" * 4, len(head))
    with pytest.raises(TensorError, match="no input's binary_data_size"):
        parse_request(head + b"\0" * 12, len(head))
    with pytest.raises(TensorError, match="only"):
        parse_request(head, len(head) + 1)


def test_the_wire_format_round_trips_through_the_runtime_codecs() -> None:
    request = InferRequest(
        inputs=[
            from_numpy("a", np.arange(4, dtype=np.float16).reshape(2, 2)),
            from_numpy("s", np.array(["é", "b"], dtype=object)),
        ],
        id="r",
    )
    body, length = wire_request(request)
    arrays = codecs.decode_tensors(body, f"{codecs.TENSORS}; header-length={length}")
    assert arrays["a"].dtype == np.float16 and arrays["a"].shape == (2, 2)
    assert arrays["s"].tolist() == ["é".encode(), b"b"]
    answer, content_type = codecs.encode_tensors({"y": arrays["a"] * 2, "ok": np.array([True])})
    outputs = parse_response(answer, header_length_of(content_type, None))
    assert [t.datatype for t in outputs] == ["FP16", "BOOL"]
    np.testing.assert_array_equal(to_numpy(outputs[0]), np.arange(4).reshape(2, 2) * 2)


def test_outputs_go_back_as_the_client_asked() -> None:
    y = from_numpy("y", np.array([1.0, 2.0]))
    z = from_numpy("z", np.array([3], dtype=np.int64))
    asked = InferRequest(inputs=[], outputs=[("z", True), ("y", None)])
    body, length = rest_response({"model_name": "m"}, select_outputs(asked, [y, z]))
    assert length is not None
    header = json.loads(body[:length])
    assert [o["name"] for o in header["outputs"]] == ["z", "y"]
    assert header["outputs"][1]["data"] == [1.0, 2.0]
    assert body[length:] == z.raw
    with pytest.raises(TensorError, match="no output 'w'"):
        select_outputs(InferRequest(inputs=[], outputs=[("w", None)]), [y])
    all_json, none = rest_response({}, select_outputs(InferRequest(inputs=[]), [y]))
    assert none is None and json.loads(all_json)["outputs"][0]["data"] == [1.0, 2.0]


def test_an_answer_in_json_needs_no_header_length() -> None:
    body, _ = encode_binary([Tensor("t", "INT8", [1], b"\x05")], "outputs")
    answer = json.dumps({"outputs": [{"name": "t", "datatype": "INT8", "shape": [1], "data": [5]}]})
    assert parse_response(answer.encode(), None)[0].raw == b"\x05"
    assert header_length_of("application/json", "12") == 12
    with pytest.raises(TensorError):
        header_length_of(None, "x")


def test_bool_tensors_parse_from_json() -> None:
    (tensor,) = parse_request(
        _json({"name": "b", "datatype": "BOOL", "shape": [2], "data": [True, False]}), None
    ).inputs
    assert tensor.raw == b"\x01\x00"


def test_json_nested_past_the_decoders_depth_is_a_bad_request() -> None:
    with pytest.raises(TensorError, match="does not parse"):
        parse_request(b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None)
    with pytest.raises(InvalidBody, match="not valid JSON"):
        codecs.decode(b"[" * 100_000 + b"]" * 100_000, "application/json")


@pytest.mark.parametrize(
    ("literal", "words"),
    [
        ("NaN", "NaN is not JSON"),
        ("Infinity", "Infinity is not JSON"),
        ("-Infinity", "-Infinity is not JSON"),
        ("1e400", "past the range of any float"),  # JSON, but Python reads it as inf
    ],
)
def test_numbers_json_has_not_or_no_float_holds_are_refused(literal: str, words: str) -> None:
    """Python's json reads NaN and Infinity, which JSON (RFC 8259) has not."""
    body = (
        b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [%s]}]}'
        % literal.encode()
    )
    with pytest.raises(TensorError, match=words):
        parse_request(body, None)


def test_nan_and_infinities_given_as_floats_stay() -> None:
    """Over gRPC, fp32_contents are IEEE floats: NaN (a missing value, to XGBoost) and
    the infinities are values, not overflows. A model's answer may hold them too."""
    raw = json_to_raw("x", "FP32", [3], [1.0, math.nan, -math.inf])
    values = np.frombuffer(raw, dtype="<f4")
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2] == -math.inf
    answer = b'{"outputs": [{"name": "y", "datatype": "FP64", "shape": [1], "data": [NaN]}]}'
    (tensor,) = parse_response(answer, None)
    assert math.isnan(np.frombuffer(tensor.raw, dtype="<f8")[0])
