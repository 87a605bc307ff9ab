"""DataProcessing: SageMaker's JSONPath subset, filters on JSON and CSV records, joins."""

from __future__ import annotations

import pytest

from shipyard.errors import FilterError, SplitError
from shipyard.transform.jsonpath import (
    apply_input_filter,
    apply_output_filter,
    compile_filter,
    join_input,
)

JSON = "application/json"
CSV = "text/csv"
DOC = b'{"id":"r1","a":{"b":7},"features":[0,1,2,3,4,5,6],"tags":["x","y","z"]}'
ROW = b"id1,10,20,30,40"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("$", DOC),
        ("$.a.b", b"7"),
        ("$['a']", b'{"b":7}'),
        ("$[\"a\"]['b']", b"7"),
        ("$.a.['b']", b"7"),
        ("$['id','a']", b'{"id":"r1","a":{"b":7}}'),
        ("$[ 'id' , 'missing' ]", b'{"id":"r1"}'),
        ("$.features[0:5]", b"[0,1,2,3,4,5]"),
        ("$.features[:2]", b"[0,1,2]"),
        ("$.features[5:]", b"[5,6]"),
        ("$.features[-2:]", b"[5,6]"),
        ("$.features[4:2]", b"[]"),
        ("$.features[0:100]", b"[0,1,2,3,4,5,6]"),
        ("$.features[0,2]", b"[0,2]"),
        ("$.features[-1]", b"6"),
        ("$.features[0,5:]", b"[0,5,6]"),
        ("$.tags[*]", b'["x","y","z"]'),
        ("$.a.*", b"[7]"),
    ],
)
def test_each_form_of_the_subset_on_a_json_record(expression, expected):
    assert apply_input_filter(DOC, compile_filter(expression), JSON) == expected


def test_steps_after_a_union_apply_to_each_element():
    record = b'{"rows":[{"v":1},{"v":2},{"v":3}]}'
    assert apply_input_filter(record, compile_filter("$.rows[0:1].v"), JSON) == b"[1,2]"
    assert apply_input_filter(record, compile_filter("$.rows[*].v"), JSON) == b"[1,2,3]"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("$[1:]", b"10,20,30,40"),
        ("$[0]", b"id1"),
        ("$[-1]", b"40"),
        ("$[0,-1]", b"id1,40"),
        ("$[1:2]", b"10,20"),
        ("$[:1]", b"id1,10"),
        ("$[*]", ROW),
    ],
)
def test_a_csv_line_is_an_array_of_its_columns_and_stays_csv(expression, expected):
    assert apply_input_filter(ROW, compile_filter(expression), CSV) == expected


def test_csv_quoting_is_read_and_written_back():
    record = b'7,"a, b","say ""hi"""'
    assert apply_input_filter(record, compile_filter("$[1:]"), CSV) == b'"a, b","say ""hi"""'


def test_records_without_a_content_type_are_told_apart_by_their_first_byte():
    assert apply_input_filter(b"[1,2,3]", compile_filter("$[1:]"), None) == b"[2,3]"
    assert apply_input_filter(b"1,2,3", compile_filter("$[1:]"), None) == b"2,3"
    assert apply_input_filter(b' {"k":1}', compile_filter("$.k"), "text/plain") == b"1"
    assert apply_input_filter(b"1,2", compile_filter("$[0]"), "text/csv; charset=utf-8") == b"1"


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("", "must start with \\$"),
        ("features", "must start with \\$"),
        ("$..id", "recursive descent"),
        ("$.store..price", "recursive descent"),
        ("$[?(@.price < 10)]", "filter and script"),
        ("$[(@.length-1)]", "filter and script"),
        ("@.id", "must start with \\$"),
        ("$[::2]", "slice steps"),
        ("$[1:5:2]", "slice steps"),
        ("$[0:2,246:]", "only one range"),
        ("$.", "a name is expected"),
        ("$.a b", "unexpected ' '"),
        ("$[", "an index, a range or a quoted name"),
        ("$[]", "an index, a range or a quoted name"),
        ("$[a]", "an index, a range or a quoted name"),
        ("$['a'", "'\\]' is expected"),
        ("$['a]", "not closed"),
        ("$['a',1]", "a quoted name is expected"),
        ("$[1,'a']", "an index, a range or a quoted name"),
        ("$[-]", "a number is expected"),
        ("$.length()", "unexpected '\\('"),
    ],
)
def test_anything_outside_the_subset_is_refused_with_where(expression, problem):
    with pytest.raises(ValueError, match=problem) as caught:
        compile_filter(expression)
    assert "at character" in str(caught.value)


def test_key_filters_are_refused_for_csv_when_the_content_type_is_known():
    with pytest.raises(ValueError, match="text/csv records are arrays"):
        compile_filter("$.features", content_type=CSV)
    assert compile_filter("$[1:]", content_type=CSV).expression == "$[1:]"
    with pytest.raises(FilterError, match="only columns"):
        apply_input_filter(ROW, compile_filter("$.id"), CSV)


@pytest.mark.parametrize(
    ("record", "expression", "problem"),
    [
        (DOC, "$.nope", "no key 'nope'"),
        (DOC, "$.features[7]", "index 7 is outside an array of 7"),
        (DOC, "$.features[0,9]", "index 9 is outside"),
        (DOC, "$.id[0]", "an index is asked of a JSON str"),
        (b"[1,2]", "$.id", "a key is asked of a JSON array"),
        (b"{not json", "$.id", "not JSON"),
        (b"1,2", "$[5]", "index 5 is outside an array of 2"),
    ],
)
def test_a_record_the_filter_cannot_apply_to_is_a_filter_error(record, expression, problem):
    with pytest.raises(FilterError, match=problem) as caught:
        apply_input_filter(record, compile_filter(expression), None)
    assert isinstance(caught.value, SplitError)


def test_a_compiled_filter_reads_as_its_expression():
    assert repr(compile_filter("$[1:]")) == "Filter('$[1:]')"


# -- JoinSource Input -------------------------------------------------------------------------


def test_a_json_object_gets_the_output_under_sagemaker_output():
    joined = join_input(b'{"key":1}', b'{"label":1}\n', JSON, JSON)
    assert joined == b'{"key":1,"SageMakerOutput":{"label":1}}'


def test_an_input_sagemaker_output_key_is_overwritten_as_the_docs_warn():
    joined = join_input(b'{"SageMakerOutput":0,"k":1}', b"5", JSON, JSON)
    assert joined == b'{"SageMakerOutput":5,"k":1}'


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (b"[1,2,3]", b'{"SageMakerInput":[1,2,3],"SageMakerOutput":[0.5]}'),
        (b'"text"', b'{"SageMakerInput":"text","SageMakerOutput":[0.5]}'),
        (b"42", b'{"SageMakerInput":42,"SageMakerOutput":[0.5]}'),
    ],
)
def test_other_json_is_wrapped_with_sagemaker_input(source, expected):
    assert join_input(source, b"[0.5]", "application/jsonlines", JSON) == expected


def test_a_csv_answer_joined_to_json_is_its_columns():
    assert join_input(b'{"k":1}', b"0.9\n", JSON, CSV) == b'{"k":1,"SageMakerOutput":0.9}'
    assert join_input(b'{"k":1}', b"a,2", JSON, CSV) == b'{"k":1,"SageMakerOutput":["a",2]}'


def test_csv_gets_the_output_columns_appended():
    assert join_input(b"1,2,3", b"1\n", CSV, CSV) == b"1,2,3,1"
    assert join_input(b'x,"a, b"', b"0.1,0.9\r\n", CSV, CSV) == b'x,"a, b",0.1,0.9'
    assert join_input(b"1,2", b"[0.1,0.9]", CSV, JSON) == b"1,2,0.1,0.9"
    assert join_input(b"1,2", b'{"p":1}', CSV, JSON) == b'1,2,"{""p"":1}"'


def test_output_filter_applies_to_the_joined_record():
    """The docs' example: InputFilter drops the id, the join brings it back from the
    original input, and OutputFilter keeps the id and the prediction."""
    original = b'{"id":"r7","features":[1,2,3]}'
    sent = apply_input_filter(original, compile_filter("$.features"), JSON)
    assert sent == b"[1,2,3]"
    joined = join_input(original, b'{"label":1}', JSON, JSON)
    kept = apply_output_filter(joined, compile_filter("$['id','SageMakerOutput']"), JSON)
    assert kept == b'{"id":"r7","SageMakerOutput":{"label":1}}'


def test_csv_output_filter_keeps_an_id_and_the_prediction():
    original = b"id9,5.1,3.5,1.4"
    assert apply_input_filter(original, compile_filter("$[1:]"), CSV) == b"5.1,3.5,1.4"
    joined = join_input(original, b"0.87", CSV, CSV)
    assert apply_output_filter(joined, compile_filter("$[0,-1]"), CSV) == b"id9,0.87"


def test_the_root_filter_returns_the_record_untouched():
    record = b'{ "spaced" : true }'
    assert apply_output_filter(record, compile_filter("$"), JSON) == record


def test_quoted_names_may_escape_their_quote_and_unions_may_nest():
    record = b'{"it\'s":1,"rows":[[1,2],[3,4]]}'
    assert apply_input_filter(record, compile_filter("$['it\\'s']"), JSON) == b"1"
    assert apply_input_filter(record, compile_filter("$.rows[*][0:0]"), JSON) == b"[1,3]"
    with pytest.raises(ValueError, match="not closed"):
        compile_filter("$['a\\")


def test_a_csv_record_that_is_not_utf8_is_a_filter_error():
    with pytest.raises(FilterError, match="not UTF-8"):
        apply_input_filter(b"\xff,1", compile_filter("$[0]"), CSV)


def test_a_csv_record_with_a_field_past_128_kib_is_filtered_like_any_other():
    # csv's default field limit (131,072 characters) once failed such a record.
    field = "x" * 200_000
    record = f'1,"{field}",3'.encode()
    assert apply_input_filter(record, compile_filter("$[1]"), CSV) == field.encode()


def test_a_json_record_nested_past_the_decoders_depth_is_a_filter_error():
    with pytest.raises(FilterError, match="not JSON"):
        apply_input_filter(b"[" * 100_000 + b"]" * 100_000, compile_filter("$[0]"), JSON)
