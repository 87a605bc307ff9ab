"""Which runtime serves an image: the built-in one, a ``cmd:`` command, or a container.

Read by the backends, which start it, and by host_access.py, which decides whether a
caller may name it (container images under ``auth:`` only from ``auth.allow_images``).
"""

from __future__ import annotations

import os

BUILTIN_IMAGES = ("shipyard/python",)
FRAMEWORK_REPOSITORIES = (
    "sagemaker-scikit-learn",
    "sagemaker-xgboost",
    "xgboost",
    "pytorch-inference",
    "pytorch-training",
    "tensorflow-inference",
    "tensorflow-training",
    "mxnet-inference",
    "mxnet-training",
)
"""The repositories of SageMaker's framework images (as the sagemaker SDK's image_uris
names them), served by the built-in runtime; and every ``huggingface-*`` one. Matched on
the repository's name, not anywhere in the URI: a team's own ``acme/sklearn-server`` is
a container image."""


def is_framework_image(image: str) -> bool:
    """Whether ``image`` is a SageMaker framework image URI (by its repository's name)."""
    repository = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return repository in FRAMEWORK_REPOSITORIES or repository.startswith("huggingface-")


FRAMEWORK_IMAGES_ENV = "SHIPYARD_FRAMEWORK_IMAGES"
"""``builtin`` (default) or ``container``: what serves a SageMaker framework image URI.
The gateway's setting (Settings.framework_images); a job runner is given it too."""


def runtime_for(image: str) -> str:
    """Which runtime serves ``image``: ``python``, ``cmd`` or ``docker``.

    A framework image URI is the built-in runtime's unless SHIPYARD_FRAMEWORK_IMAGES is
    ``container`` (read here, each time: the gateway and its job runners, which are
    processes of their own, decide alike)."""
    if image.startswith("cmd:"):
        return "cmd"
    if image in BUILTIN_IMAGES:
        return "python"
    if is_framework_image(image):
        return "docker" if os.environ.get(FRAMEWORK_IMAGES_ENV) == "container" else "python"
    return "docker"
