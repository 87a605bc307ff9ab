"""The fuzz's request builder: its skeletons are valid, its mutations reproducible."""

from __future__ import annotations

import random

import botocore.session
import pytest

from shipyard.gateway.api.actions import ACTIONS, JOB_ACTIONS, LOCAL_URI_SHAPES
from shipyard.gateway.wire.validation import RequestValidator
from tests.fuzz.shapes import MISSING, Skeletons, mutate

OPERATIONS = sorted({*ACTIONS, *JOB_ACTIONS})


@pytest.fixture(scope="module")
def model() -> object:
    return botocore.session.get_session().get_service_model("sagemaker")


@pytest.fixture(scope="module")
def validator() -> RequestValidator:
    return RequestValidator(unpatterned=LOCAL_URI_SHAPES)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_skeleton_passes_the_gateways_validator(
    model: object, validator: RequestValidator, operation: str
) -> None:
    skeletons = Skeletons(model, random.Random(1), lambda *_: MISSING)
    for index in range(20):
        request, shapes = skeletons.build(operation, full=index % 2 == 1)
        validator.validate(operation, request.params)
        assert () in shapes


def test_the_same_seed_gives_the_same_requests(model: object) -> None:
    def bodies(seed: int) -> list[bytes]:
        rng = random.Random(seed)
        skeletons = Skeletons(model, rng, lambda *_: MISSING)
        out = []
        for _ in range(30):
            request, shapes = skeletons.build("CreateEndpointConfig")
            out.append(mutate(request, shapes, rng).body())
        return out

    assert bodies(5) == bodies(5)
    assert bodies(5) != bodies(6)
