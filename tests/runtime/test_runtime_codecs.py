"""The default input_fn and output_fn, in process."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from shipyard.errors import InvalidBody, UnsupportedAccept, UnsupportedContentType
from shipyard.runtime import codecs


def test_json_decodes_to_plain_python() -> None:
    assert codecs.decode(b'{"instances": [[1, 2]]}', "application/json") == {"instances": [[1, 2]]}


def test_content_type_parameters_and_case_are_ignored() -> None:
    assert codecs.decode(b"[1]", "Application/JSON; charset=utf-8") == [1]


def test_csv_decodes_to_a_2d_float_array() -> None:
    array = codecs.decode(b"1,2\n\n3,4\n", "text/csv")
    assert array.dtype == np.float64
    np.testing.assert_array_equal(array, [[1.0, 2.0], [3.0, 4.0]])


def test_one_csv_line_is_still_2d() -> None:
    assert codecs.decode(b"1,2,3", "text/csv").shape == (1, 3)


@pytest.mark.parametrize("body", [b"", b" \n", b"1,2\n3\n", b"a,b", b"\xff,1"])
def test_bad_csv_is_invalid_body(body: bytes) -> None:
    with pytest.raises(InvalidBody) as info:
        codecs.decode(body, "text/csv")
    assert info.value.status_code == 400


def test_npy_round_trips() -> None:
    array = np.arange(4, dtype=np.int32)
    body, content_type = codecs.encode(array, "application/x-npy")
    assert content_type == "application/x-npy"
    decoded = codecs.decode(body, "application/x-npy")
    assert decoded.dtype == np.int32
    np.testing.assert_array_equal(decoded, array)


def test_unknown_content_type_is_415() -> None:
    with pytest.raises(UnsupportedContentType) as info:
        codecs.decode(b"x", "text/plain")
    assert info.value.status_code == 415


def test_json_encodes_numpy_arrays_and_scalars_anywhere() -> None:
    prediction = {"predictions": np.array([1.5, 2.0]), "count": np.int64(2), "p": np.float32(0.5)}
    body, content_type = codecs.encode(prediction, "application/json")
    assert content_type == "application/json"
    assert json.loads(body) == {"predictions": [1.5, 2.0], "count": 2, "p": 0.5}


def test_json_refuses_what_it_cannot_encode() -> None:
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        codecs.encode(object(), "application/json")


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        (np.array([[1.0, 2.0], [3.0, 4.0]]), b"1.0,2.0\n3.0,4.0\n"),
        (np.array([1, 2]), b"1\n2\n"),
        ([["a,b", 1]], b'"a,b",1\n'),
        (7, b"7\n"),
    ],
)
def test_csv_encodes_rows(prediction: object, expected: bytes) -> None:
    assert codecs.encode(prediction, "text/csv") == (expected, "text/csv")


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("*/*", "application/json"),
        ("text/csv; q=0.5", "text/csv"),
        ("image/png, application/x-npy", "application/x-npy"),
        ("image/png, */*", "application/json"),
    ],
)
def test_accept_picks_the_first_known_type(accept: str, chosen: str) -> None:
    assert codecs.encode([1], accept)[1] == chosen


def test_unknown_accept_is_406() -> None:
    with pytest.raises(UnsupportedAccept) as info:
        codecs.encode([1], "image/png")
    assert info.value.status_code == 406


def test_npy_output_never_pickles() -> None:
    with pytest.raises(ValueError):
        codecs.encode(np.array([{}], dtype=object), "application/x-npy")
    assert np.load(io.BytesIO(codecs.encode([1.0], "application/x-npy")[0])).tolist() == [1.0]
