"""What an instance's process runs, and where it finds its model.

The built-in runtime, or ``shipyard.launch`` running a ``cmd:`` image's command, told
where its model is: unsandboxed, the instance fetches its artifact itself into this
host's cache (shipyard/launch.py), shared by its instances; sandboxed, the gateway
fetches it and the command is wrapped in ``bwrap`` (backends/sandbox.py).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from shipyard import launch
from shipyard.backends.base import InstanceSpec
from shipyard.backends.sandbox import MODEL_DIR, Sandbox
from shipyard.errors import BackendError
from shipyard.routing.model_agent import MODELS_FOLDER
from shipyard.storage.artifacts import ArtifactStore


def command(
    spec: InstanceSpec,
    kind: str,
    port: int,
    where: list[str],
    error_file: Path,
    unix_fd: int | None = None,
    token_fd: int | None = None,
) -> list[str]:
    """The command of an instance: the built-in runtime, or ``shipyard.launch`` running
    a ``cmd:`` image's command. ``where`` says where its model is, ``unix_fd`` which
    descriptor is its bound Unix socket, ``token_fd`` where a component's copy reads its
    adapters token (InstanceSpec.adapters_token)."""
    if kind == "python":
        argv = [sys.executable, "-m", "shipyard.runtime", "--port", str(port)]
        if unix_fd is not None:
            argv += ["--unix-socket-fd", str(unix_fd)]
        if token_fd is not None:
            argv += ["--adapters-token-fd", str(token_fd)]
        return [*argv, *where, "--error-file", str(error_file)]
    argv = [sys.executable, "-m", "shipyard.launch", *where, "--error-file", str(error_file)]
    return [*argv, "--", "/bin/sh", "-c", spec.image.removeprefix("cmd:")]


class InstanceCommands:
    """Builds instances' commands over one host's artifact cache."""

    def __init__(
        self,
        *,
        models_dir: Path,
        s3_endpoint_url: str | None = None,
        artifacts: ArtifactStore | None = None,
    ) -> None:
        self.models_dir = models_dir
        """This host's artifact cache: instances fetch their model into it."""
        self.s3_endpoint_url = s3_endpoint_url
        self.artifacts = artifacts
        """Fetches a sandboxed instance's model in the gateway's process, with
        ``auth.file_roots`` enforced; None: one with the gateway's S3 endpoint only."""

    def __repr__(self) -> str:
        return f"InstanceCommands(models_dir={str(self.models_dir)!r})"

    def where(self, spec: InstanceSpec, kind: str, env: dict[str, str]) -> list[str]:
        """The arguments saying where an unsandboxed instance finds its model: its own
        folder, or the artifact it fetches into this host's cache."""
        if spec.workdir is not None:
            env["SM_MODEL_DIR"] = str(spec.workdir)
            return ["--model-dir", str(spec.workdir)]
        if kind == "python" and not spec.model_url:
            return ["--model-dir", str(self._empty_model_dir())]
        where = ["--model-cache", str(self.models_dir)]
        if spec.model_url:
            where += ["--model-url", spec.model_url]
        return where

    async def sandboxed(
        self,
        sandbox: Sandbox,
        spec: InstanceSpec,
        kind: str,
        port: int,
        env: dict[str, str],
        error_file: Path,
        home: Path,
        unix_fd: int | None,
        token_fd: int | None,
    ) -> list[str]:
        """The ``bwrap`` command of a sandboxed instance.

        Its model folder is read-only, so the instance cannot fetch into it: the
        artifact is fetched here (into the same cache slot an unsandboxed instance uses)
        and shown at ``/opt/ml/model``; a framework model's code is fetched by the
        instance into its own ``/tmp``. A multi-model instance's folder (its disk cache)
        is its own and writable, but for the folder a ``cmd:`` server's models are
        fetched into by the gateway (routing/model_agent.py), read-only inside: the
        gateway writes and deletes there, so the instance must not be able to put a
        link in its place. Never from a warm spare: a spare is started before it
        knows its model, so it would have to see every model of the cache (and write
        the shared list of imports); serverless cold starts pay the imports instead.
        """
        env["TMPDIR"] = "/tmp"  # the gateway's may be a folder the sandbox does not show
        error_file.touch()  # bound, so it must exist; an empty one reads as no reason
        writable = [home, error_file]
        readonly = []
        model = None
        if spec.workdir is not None:
            where = ["--model-dir", str(spec.workdir)]
            env["SM_MODEL_DIR"] = str(spec.workdir)
            writable.append(spec.workdir)
            if kind == "cmd":
                readonly.append(_gateway_folder(spec.workdir / MODELS_FOLDER))
        else:
            model = await asyncio.to_thread(self._fetch_model, spec)
            where = ["--model-dir", str(MODEL_DIR)]
        argv = command(spec, kind, port, where, error_file, unix_fd, token_fd)
        return sandbox.wrap(
            argv, chdir=spec.workdir or home, writable=writable, readonly=readonly, model=model
        )

    def _fetch_model(self, spec: InstanceSpec) -> Path:
        """The instance's model folder in this host's cache, fetched if need be."""
        if not spec.model_url:
            return self._empty_model_dir()
        try:
            return launch.model_folder(
                spec.model_url,
                self.models_dir,
                s3_endpoint_url=self.s3_endpoint_url,
                store=self.artifacts,
            )
        except Exception as exc:
            text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise BackendError(
                f"Instance {spec.instance_id} failed to start: {type(exc).__name__}: {text}"
            ) from exc

    def _empty_model_dir(self) -> Path:
        empty = self.models_dir / "_empty"
        empty.mkdir(parents=True, exist_ok=True)
        return empty


def _gateway_folder(path: Path) -> Path:
    """``path``, a folder inside a sandbox's writable one that only the gateway writes
    (bound read-only over it), made a real folder again if something replaced it."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(exist_ok=True)
    return path
