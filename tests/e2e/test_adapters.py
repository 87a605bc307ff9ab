"""Adapter inference components (BaseInferenceComponentName) end to end with boto3: an
adapter loaded into its base component's copies, invoked on both doors, updated, brought
back from zero copies with its base, refused where it cannot be, and unloaded when
deleted."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import GatewayProcess, wait_until
from tests.e2e.test_inference_components import component_endpoint, wait_component


def adapter_folder(root: Path, name: str, scale: float) -> str:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "adapter.json").write_text(json.dumps({"scale": scale}))
    return folder.as_uri()


def create_adapter(sm: Any, name: str, base: str, url: str) -> None:
    sm.create_inference_component(
        InferenceComponentName=name,
        EndpointName="lora",
        Specification={"BaseInferenceComponentName": base, "Container": {"ArtifactUrl": url}},
    )


def ask(rt: Any, component: str, numbers: list[float]) -> dict[str, Any]:
    out = rt.invoke_endpoint(
        EndpointName="lora",
        InferenceComponentName=component,
        Body=json.dumps(numbers).encode(),
        ContentType="application/json",
    )
    answer: dict[str, Any] = json.loads(out["Body"].read())
    return answer


def test_an_adapter_is_loaded_into_its_base_components_copies(
    gateway: GatewayProcess, model_tarball: Callable[[str], str], tmp_path: Path
) -> None:
    sm, rt = gateway.sm, gateway.rt
    component_endpoint(sm, "lora", count=1)
    sm.create_inference_component(
        InferenceComponentName="base",
        EndpointName="lora",
        VariantName="AllTraffic",
        Specification={
            "Container": {"Image": "shipyard/python", "ArtifactUrl": model_tarball("lora")},
            "ComputeResourceRequirements": {
                "NumberOfCpuCoresRequired": 0.5,
                "MinMemoryRequiredInMb": 512,
            },
            "StartupParameters": {"ContainerStartupHealthCheckTimeoutInSeconds": 120},
        },
        RuntimeConfig={"CopyCount": 2},
    )
    wait_component(sm, "base")
    create_adapter(sm, "ten", "base", adapter_folder(tmp_path, "ten", 10))
    described = wait_component(sm, "ten")
    assert described["Specification"]["BaseInferenceComponentName"] == "base"
    assert described["RuntimeConfig"]["CurrentCopyCount"] == 2  # its base's copies

    # Every request for the adapter is served by a base copy with the adapter loaded.
    answers = [ask(rt, "ten", [1, 2, 3]) for _ in range(6)]
    assert {a["sum"] for a in answers} == {60.0}
    assert {a["adapter"] for a in answers} == {"ten"}
    base = ask(rt, "base", [1, 2, 3])
    assert base["sum"] == 6.0 and base["adapter"] is None
    # Requests for the base and the adapter share its copies' queue: under concurrent
    # load of both, none waits beside a copy left idle.
    quick = gateway.client("sagemaker-runtime", read_timeout=20, max_attempts=1)

    def burst(n: int) -> list[float]:
        return [ask(quick, "ten" if k % 2 else "base", [1])["sum"] for k in range(n)]

    with ThreadPoolExecutor(6) as pool:
        sums = [s for part in pool.map(burst, [12] * 6) for s in part]
    assert sorted(set(sums)) == [1.0, 10.0] and len(sums) == 72
    streamed = rt.invoke_endpoint_with_response_stream(
        EndpointName="lora",
        InferenceComponentName="ten",
        Body=b"[4, 5]",
        ContentType="application/json",
    )
    body = b"".join(e["PayloadPart"]["Bytes"] for e in streamed["Body"] if "PayloadPart" in e)
    assert json.loads(body)["sum"] == 90.0

    # A new artifact: the copies load it in place of the old one at their next request.
    sm.update_inference_component(
        InferenceComponentName="ten",
        Specification={
            "BaseInferenceComponentName": "base",
            "Container": {"ArtifactUrl": adapter_folder(tmp_path, "ten-v2", 100)},
        },
    )
    wait_until(
        lambda: ask(rt, "ten", [1])["sum"] == 100.0, "the adapter's new artifact", timeout_s=60
    )
    v2 = sm.describe_inference_component(InferenceComponentName="ten")["Specification"]
    # One that fails to load (no adapter.json): the previous artifact serves on, and
    # Describe shows it, InService, with the failure.
    broken = tmp_path / "broken"
    broken.mkdir()
    sm.update_inference_component(
        InferenceComponentName="ten",
        Specification={"BaseInferenceComponentName": "base",
                       "Container": {"ArtifactUrl": broken.as_uri()}},
    )  # fmt: skip

    def reason() -> str:
        found = sm.describe_inference_component(InferenceComponentName="ten")
        return str(found.get("FailureReason") or "")

    wait_until(lambda: "failed" in reason(), "the failed adapter update recorded")
    after = sm.describe_inference_component(InferenceComponentName="ten")
    assert after["InferenceComponentStatus"] == "InService"
    assert after["Specification"] == v2
    assert [ask(rt, "ten", [1])["sum"] for _ in range(4)] == [100.0] * 4

    # The base at zero copies: a request for the adapter brings a copy back.
    sm.update_inference_component_runtime_config(
        InferenceComponentName="base", DesiredRuntimeConfig={"CopyCount": 0}
    )
    wait_until(
        lambda: (
            sm.describe_inference_component(InferenceComponentName="base")["RuntimeConfig"][
                "CurrentCopyCount"
            ]
            == 0
        ),
        "base at zero copies",
    )
    assert ask(rt, "ten", [2])["sum"] == 200.0

    # Deleted: out of routing (and unloaded from the copy that held it).
    sm.delete_inference_component(InferenceComponentName="ten")
    wait_until(
        lambda: "ten" not in [c["InferenceComponentName"]
                              for c in sm.list_inference_components()["InferenceComponents"]],
        "adapter deleted",
    )  # fmt: skip
    assert ask(rt, "base", [1])["sum"] == 1.0
    with pytest.raises(ClientError) as gone:
        ask(rt, "ten", [1])
    assert gone.value.response["Error"]["Code"] == "ValidationError"


def test_adapters_are_refused_where_they_cannot_run(
    gateway: GatewayProcess, model_tarball: Callable[[str], str], tmp_path: Path
) -> None:
    sm, rt = gateway.sm, gateway.rt
    component_endpoint(sm, "lora", count=1)
    needs = {"NumberOfCpuCoresRequired": 0.5, "MinMemoryRequiredInMb": 512}
    for name, model in (("base", "lora"), ("plain", "echo")):
        sm.create_inference_component(
            InferenceComponentName=name,
            EndpointName="lora",
            Specification={
                "Container": {"Image": "shipyard/python", "ArtifactUrl": model_tarball(model)},
                "ComputeResourceRequirements": needs,
            },
            RuntimeConfig={"CopyCount": 1},
        )
    wait_component(sm, "base")
    url = adapter_folder(tmp_path, "ten", 10)

    def refused(call: Callable[[], object], words: str) -> None:
        with pytest.raises(ClientError) as error:
            call()
        assert words in str(error.value), error.value

    refused(lambda: create_adapter(sm, "x", "missing", url), "base inference component missing")
    refused(
        lambda: sm.create_inference_component(
            InferenceComponentName="x",
            EndpointName="lora",
            Specification={
                "BaseInferenceComponentName": "base",
                "Container": {"ArtifactUrl": url},
                "ComputeResourceRequirements": needs,
            },
        ),
        "takes its base's copies",
    )
    refused(
        lambda: sm.create_inference_component(
            InferenceComponentName="x",
            EndpointName="lora",
            Specification={"BaseInferenceComponentName": "base"},
        ),
        "ArtifactUrl",
    )
    refused(
        lambda: sm.create_inference_component(
            InferenceComponentName="x", EndpointName="lora", Specification={"ModelName": "m"}
        ),
        "RuntimeConfig is required",
    )
    create_adapter(sm, "ten", "base", url)
    wait_component(sm, "ten")
    refused(lambda: create_adapter(sm, "x", "ten", url), "not an adapter itself")
    refused(
        lambda: sm.update_inference_component_runtime_config(
            InferenceComponentName="ten", DesiredRuntimeConfig={"CopyCount": 3}
        ),
        "scale that one instead",
    )
    refused(
        lambda: sm.delete_inference_component(InferenceComponentName="base"),
        "is the base of ten",
    )
    # A base made an adapter would strand its adapters; an adapter has no copies to scale.
    refused(
        lambda: sm.update_inference_component(
            InferenceComponentName="base",
            Specification={
                "BaseInferenceComponentName": "plain",
                "Container": {"ArtifactUrl": url},
            },
        ),
        "is not an adapter",
    )
    scaling = gateway.client("application-autoscaling")
    refused(
        lambda: scaling.register_scalable_target(
            ServiceNamespace="sagemaker", ResourceId="inference-component/ten",
            ScalableDimension="sagemaker:inference-component:DesiredCopyCount",
            MinCapacity=1, MaxCapacity=2,
        ),
        "is an adapter",
    )  # fmt: skip

    # A base whose model_fn takes no adapter folder: the adapter is loaded as a model of
    # its own (here the sum model, with its own code) in the base's copies.
    create_adapter(sm, "own", "plain", model_tarball("sum"))
    wait_component(sm, "own")
    out = rt.invoke_endpoint(
        EndpointName="lora", InferenceComponentName="own", Body=b"[[1, 2], [3, 4]]",
        ContentType="application/json",
    )  # fmt: skip
    assert json.loads(out["Body"].read()) == [3.0, 7.0]
    plain = rt.invoke_endpoint(
        EndpointName="lora", InferenceComponentName="plain", Body=b"[[1, 2]]",
        ContentType="application/json",
    )  # fmt: skip
    assert json.loads(plain["Body"].read()) == [[1, 2]]  # the base still echoes
    # An artifact that cannot be loaded fails the adapter, not its base.
    create_adapter(sm, "lost", "base", (tmp_path / "nowhere").as_uri())
    lost = wait_component(sm, "lost", "Failed")
    assert "AdapterLoadFailed" in lost["FailureReason"]
    assert ask(rt, "base", [1, 1])["sum"] == 2.0
