"""Backends are chosen by name from a registry and declare what they can run."""

from __future__ import annotations

from pathlib import Path

import pytest

from shipyard.backends import BackendContext, create_backend, names
from shipyard.backends.base import runtime_for
from shipyard.backends.local import LocalBackend


def test_local_is_registered_with_what_it_can_run(tmp_path: Path) -> None:
    backend, capabilities = create_backend(
        "local", BackendContext(home=tmp_path, run_dir=tmp_path / "run", environ={}, s3={})
    )
    assert isinstance(backend, LocalBackend)
    assert (
        backend.run_dir == tmp_path / "run" and backend.commands.models_dir == tmp_path / "models"
    )
    assert capabilities.runtimes == {"python", "cmd", "docker"}
    assert capabilities.shared_disk
    assert "local" in names()


def test_an_unknown_backend_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"unknown backend 'kubernetes' \(known: docker, local, ray"
    ):
        create_backend(
            "kubernetes", BackendContext(home=tmp_path, run_dir=tmp_path / "run", environ={}, s3={})
        )


def test_the_docker_backend_refuses_to_start_without_an_engine(tmp_path: Path) -> None:
    environ = {"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    with pytest.raises(ValueError, match=r"No container engine answers at unix://"):
        create_backend(
            "docker",
            BackendContext(home=tmp_path, run_dir=tmp_path / "run", environ=environ, s3={}),
        )
    # The local backend connects when a container image is first run, not before.
    backend, capabilities = create_backend(
        "local", BackendContext(home=tmp_path, run_dir=tmp_path / "run", environ=environ, s3={})
    )
    assert "docker" in capabilities.runtimes
    backend.stop_leftovers()  # no container was ever run here: no engine is asked


@pytest.mark.parametrize(
    ("image", "runtime"),
    [
        ("shipyard/python", "python"),
        (
            "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3",
            "python",
        ),
        ("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.1-cpu-py310", "python"),
        (
            "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-inference:2.1",
            "python",
        ),
        ("sagemaker-xgboost@sha256:0123", "python"),
        ("cmd:python server.py", "cmd"),
        ("acme/sklearn-server:1", "docker"),
        ("registry.local:5000/team/model", "docker"),
        ("123.dkr.ecr.us-east-1.amazonaws.com/x:1", "docker"),
    ],
)
def test_the_runtime_of_an_image_is_chosen_by_its_repository(image: str, runtime: str) -> None:
    assert runtime_for(image) == runtime


def test_framework_images_run_as_images_when_the_setting_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    framework = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1"
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_IMAGES", "container")
    assert runtime_for(framework) == "docker"
    assert runtime_for("shipyard/python") == "python"
