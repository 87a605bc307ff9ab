"""A job's ``/opt/ml`` tree inside its working folder: what its script is told, and
what it leaves behind (the model, the output data, a failure file).

Scripts written for SageMaker find everything through ``/opt/ml`` paths, the JSON files
under ``/opt/ml/input/config`` and the ``SM_*`` variables of the SageMaker training
toolkit. A job here runs as a local process, so the tree lives at ``WORKDIR/ml`` and every
path the script is given points there; a script that hard-codes ``/opt/ml`` does not work.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from shipyard.errors import ArtifactError, ClientError
from shipyard.job_contract import JobSpec, open_beneath

HOST = "algo-1"
"""The only host of a job: SageMaker's name for the first instance."""
NETWORK_INTERFACE = "eth0"
LOG_LEVEL = 20  # logging.INFO, as the toolkit sets it
OPT_ML = PurePosixPath("/opt/ml")
DEFAULT_CHECKPOINT_PATH = "checkpoints"
FAILURE_REASON_MAX_CHARS = 1024  # SageMaker's limit on FailureReason

# SageMaker's rule for channel names; it also keeps a name a single, safe folder name.
_CHANNEL_NAME = re.compile(r"[A-Za-z0-9.\-_]+")


@dataclass(frozen=True, slots=True)
class Layout:
    """The folders of one job, rooted at ``WORKDIR/ml`` in place of ``/opt/ml``."""

    root: Path
    checkpoints: Path
    checkpoint_mapped: bool
    """False when the checkpoint ``local_path`` was outside /opt/ml and fell back."""

    @classmethod
    def for_job(cls, workdir: Path, spec: JobSpec) -> Layout:
        root = workdir / "ml"
        local_path = spec.checkpoint.local_path if spec.checkpoint else None
        mapped = _map_opt_ml(root, local_path) if local_path else None
        return cls(
            root=root,
            checkpoints=mapped or root / DEFAULT_CHECKPOINT_PATH,
            checkpoint_mapped=mapped is not None or local_path is None,
        )

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.output_dir / "data"

    @property
    def failure_file(self) -> Path:
        """Where a script writes why it failed; its content becomes the FailureReason."""
        return self.output_dir / "failure"

    def channel_dir(self, name: str) -> Path:
        return self.root / "input" / "data" / name


def _map_opt_ml(root: Path, local_path: str) -> Path | None:
    """``/opt/ml/x`` → ``root/x``; None for anything outside ``/opt/ml`` or climbing out."""
    path = PurePosixPath(local_path)
    if not path.is_relative_to(OPT_ML) or ".." in path.parts or path == OPT_ML:
        return None
    return root.joinpath(*path.relative_to(OPT_ML).parts)


def prepare(layout: Layout, spec: JobSpec) -> None:
    """Create the tree and write the three config files the toolkit reads.

    Raises:
        ClientError: a channel name is not one SageMaker accepts.
        OSError: the working folder is not writable.
    """
    for channel in spec.channels:
        if not _CHANNEL_NAME.fullmatch(channel.name):
            raise ClientError(f"Channel name {channel.name!r} is invalid: use [A-Za-z0-9.-_].")
    for folder in (
        layout.config_dir,
        layout.code_dir,
        layout.model_dir,
        layout.output_data_dir,
        layout.output_dir / "intermediate",
        layout.checkpoints,
        *(layout.channel_dir(channel.name) for channel in spec.channels),
    ):
        folder.mkdir(parents=True, exist_ok=True)
    configs = {
        "hyperparameters.json": dict(spec.hyperparameters),
        "inputdataconfig.json": input_data_config(spec),
        "resourceconfig.json": resource_config(spec),
    }
    for name, content in configs.items():
        (layout.config_dir / name).write_text(json.dumps(content, indent=1))


def input_data_config(spec: JobSpec) -> dict[str, dict[str, str]]:
    """``inputdataconfig.json``: ContentType only where the channel sets one, as SageMaker."""
    config: dict[str, dict[str, str]] = {}
    for channel in spec.channels:
        entry = {
            "TrainingInputMode": channel.input_mode,
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        }
        if channel.content_type:
            entry["ContentType"] = channel.content_type
        config[channel.name] = entry
    return config


def resource_config(spec: JobSpec) -> dict[str, Any]:
    """``resourceconfig.json``: one host, as a single-instance SageMaker job sees it."""
    group = "homogeneousCluster"
    instance_type = spec.resource.instance_type
    return {
        "current_host": HOST,
        "current_instance_type": instance_type,
        "current_group_name": group,
        "hosts": [HOST],
        "instance_groups": [
            {"instance_group_name": group, "instance_type": instance_type, "hosts": [HOST]}
        ],
        "network_interface_name": NETWORK_INTERFACE,
    }


def user_hyperparameters(spec: JobSpec) -> dict[str, str]:
    """The hyperparameters meant for the script: all but SageMaker's ``sagemaker_*``."""
    return {k: v for k, v in spec.hyperparameters.items() if not k.startswith("sagemaker_")}


def user_args(spec: JobSpec) -> list[str]:
    """``--name value`` per user hyperparameter, sorted by name, values as sent."""
    return [arg for k, v in sorted(user_hyperparameters(spec).items()) for arg in (f"--{k}", v)]


def script_argv(spec: JobSpec, layout: Layout) -> list[str]:
    """The script's command line, run in ``layout.code_dir``.

    ``cmd:<command>`` images run the command through ``/bin/sh -c``; otherwise the
    ``sagemaker_program`` runs with this Python (or ``/bin/sh`` for a ``.sh`` program),
    whatever the image, since there are no containers here.

    Raises:
        ClientError: there is no program, or the submit directory does not hold it.
    """
    if spec.image.startswith("cmd:"):
        return ["/bin/sh", "-c", spec.image.removeprefix("cmd:")]
    if not spec.program:
        raise ClientError(
            "No program to run: set the hyperparameter sagemaker_program, "
            "or use an image cmd:<command>."
        )
    if not (layout.code_dir / spec.program).is_file():
        raise ClientError(
            f"The program {spec.program!r} is not in the submit directory {spec.submit_directory}."
        )
    interpreter = "/bin/sh" if spec.program.endswith(".sh") else sys.executable
    return [interpreter, spec.program, *user_args(spec)]


def script_environment(
    spec: JobSpec, layout: Layout, *, inherited: Mapping[str, str], num_cpus: int
) -> dict[str, str]:
    """``inherited`` + the job's Environment + the SM_* variables (which win)."""
    training_env = _training_env(spec, layout, num_cpus=num_cpus)
    env = {**inherited, **spec.environment}
    for key in _EXPORTED_KEYS:
        env[f"SM_{key.upper()}"] = _env_value(training_env[key])
    env["SM_HPS"] = json.dumps(training_env["hyperparameters"])
    env["SM_CHANNELS"] = json.dumps(sorted(training_env["channel_input_dirs"]))
    env["SM_TRAINING_ENV"] = json.dumps(training_env)
    for name, folder in training_env["channel_input_dirs"].items():
        env[f"SM_CHANNEL_{name.upper()}"] = folder
    for name, value in training_env["hyperparameters"].items():
        env[f"SM_HP_{name.upper()}"] = _env_value(value)
    env["SM_CHECKPOINT_DIR"] = str(layout.checkpoints)
    env["TRAINING_JOB_NAME"] = spec.name
    env["TRAINING_JOB_ARN"] = spec.arn
    return env


_EXPORTED_KEYS = (
    "model_dir",
    "output_data_dir",
    "output_dir",
    "output_intermediate_dir",
    "input_dir",
    "input_config_dir",
    "user_args",
    "current_host",
    "hosts",
    "num_cpus",
    "num_gpus",
    "resource_config",
    "input_data_config",
    "user_entry_point",
    "module_dir",
    "module_name",
    "log_level",
    "network_interface_name",
)
"""Keys of SM_TRAINING_ENV that are also exported as ``SM_<KEY>``, as the toolkit does."""


def _training_env(spec: JobSpec, layout: Layout, *, num_cpus: int) -> dict[str, Any]:
    """SM_TRAINING_ENV: the toolkit's view of the job, for a single host."""
    program = spec.program or ""
    return {
        "additional_framework_parameters": {},
        "channel_input_dirs": {c.name: str(layout.channel_dir(c.name)) for c in spec.channels},
        "current_host": HOST,
        "current_instance_type": spec.resource.instance_type,
        "framework_module": None,
        "hosts": [HOST],
        "hyperparameters": {k: _decode(v) for k, v in user_hyperparameters(spec).items()},
        "input_config_dir": str(layout.config_dir),
        "input_data_config": input_data_config(spec),
        "input_dir": str(layout.root / "input"),
        "is_master": True,
        "job_name": spec.name,
        "log_level": LOG_LEVEL,
        "master_hostname": HOST,
        "model_dir": str(layout.model_dir),
        "module_dir": spec.submit_directory or str(layout.code_dir),
        "module_name": program.removesuffix(".py").removesuffix(".sh"),
        "network_interface_name": NETWORK_INTERFACE,
        "num_cpus": num_cpus,
        "num_gpus": 0,
        "output_data_dir": str(layout.output_data_dir),
        "output_dir": str(layout.output_dir),
        "output_intermediate_dir": str(layout.output_dir / "intermediate"),
        "resource_config": resource_config(spec),
        "user_args": user_args(spec),
        "user_entry_point": program,
    }


def failure_reason(layout: Layout, exit_code: int, stderr_tail: Sequence[str]) -> str:
    """The script's own failure file if it wrote one, else its exit code and stderr tail.

    The tail is trimmed from its start, since a traceback's last lines say the most.
    """
    # Through no link: a training container writes the tree as root, and a link there
    # must not put a file of the host into the FailureReason.
    with contextlib.suppress(OSError), open_beneath(layout.root, "output/failure") as failure:
        written = failure.read(4 * FAILURE_REASON_MAX_CHARS).decode(errors="replace").strip()
        if written:
            return written
    head = f"AlgorithmError: ExitCode {exit_code}"
    if exit_code < 0:
        with contextlib.suppress(ValueError):
            head += f" (killed by {signal.Signals(-exit_code).name})"
    tail = "\n".join(stderr_tail).strip()
    if not tail:
        return head
    room = FAILURE_REASON_MAX_CHARS - len(head) - 2
    if len(tail) > room:
        tail = "..." + tail[len(tail) - room + 3 :]
    return f"{head}: {tail}"


def pack(folder: Path, archive: Path) -> None:
    """``folder``'s contents as a gzipped tar with the contents at its root, as SageMaker's.

    Links inside are packed as links, never followed. ``folder`` is a resolved path: a
    link in its place (or in a folder's above it) would lead elsewhere, and is refused.

    Raises:
        ArtifactError: ``folder`` is, or lies under, a link.
    """
    if os.path.realpath(folder) != str(folder):
        raise ArtifactError(f"{folder.name} is a link in the job's /opt/ml; it is not uploaded.")
    children = sorted(folder.iterdir()) if folder.is_dir() else []
    with tarfile.open(archive, "w:gz") as tar:
        for child in children:
            tar.add(child, arcname=child.name)


def _decode(value: str) -> Any:
    """A hyperparameter as the toolkit reads it: its JSON value when it parses, else itself."""
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


def _env_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
