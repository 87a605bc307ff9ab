"""What callers may make this host do: run commands, name local files, notify.

SECURITY.md, "Host powers are off unless granted", states these rules for operators.
Built once from the stack file's ``auth:`` section and handed to every service that
accepts an image, an environment, a location or a notification target. Without
``auth:`` the gateway is for local use and everything is allowed. With it:

- **Processes.** ``check_process`` is the one place that decides whether a process may
  start with what a caller asked for: ``cmd:`` images and ``ContainerEntrypoint`` need
  ``allow_commands``, a container image must match ``allow_images``, and the caller's
  ``Environment`` is limited (``environment_refusal`` says how; the gateway's own
  variables are refused without ``auth:`` too). Every Create path calls it: CreateModel
  (each container), CreateTrainingJob, CreateTransformJob, inference components' own
  containers, job templates put live and the jobs they start.
- **Files.** ``check_location`` refuses, early and with the field's name, a location
  outside ``file_roots``. It is a courtesy to the caller: the guard that holds is the
  one in storage/filesystems.py, where the stores open files, and both read a location
  with the same ``local_path`` and check it with the same ``FileRoots``.
- **Notifications.** ``check_notify_target`` refuses a URL a caller names as a
  notification target unless it matches ``auth.notify_targets``; topics of the stack
  file are the operator's and always allowed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from shipyard.contract import ADAPTERS_TOKEN_ENV, ADAPTERS_TOKEN_FD_ENV
from shipyard.errors import InvalidParameter, OutsideFileRoots
from shipyard.images import runtime_for
from shipyard.launch import MODEL_CODE
from shipyard.stackfile import AuthConfig
from shipyard.storage.filesystems import FileRoots

CALLER_VARIABLES = (
    "SAGEMAKER_*",
    "SHIPYARD_*",
    "SM_*",
    "TS_*",
    "MMS_*",
    "HF_*",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_THREAD_TIMEOUT",
    "NUMEXPR_NUM_THREADS",
    "KMP_AFFINITY",
    "KMP_BLOCKTIME",
    "KMP_SETTINGS",
    "TOKENIZERS_PARALLELISM",
    "TF_CPP_MIN_LOG_LEVEL",
    "MAX_INPUT_LENGTH",
    "MAX_TOTAL_TOKENS",
    "MAX_BATCH_PREFILL_TOKENS",
    "MAX_BATCH_TOTAL_TOKENS",
)
"""What a caller's ``Environment`` may name with ``allow_commands: false``, beyond
``auth.allow_environment``: the variables SageMaker's containers document. The
inference and training toolkits read ``SAGEMAKER_*`` (``SAGEMAKER_PROGRAM``,
``SAGEMAKER_MODEL_SERVER_WORKERS``, ``SAGEMAKER_TS_BATCH_SIZE``…) and ``SM_*``;
TorchServe and Multi Model Server read ``TS_*`` and ``MMS_*``; the Hugging Face
containers ``HF_*`` (``HF_TASK``, ``HF_MODEL_ID``) and TGI's ``MAX_*_TOKENS`` and
``MAX_INPUT_LENGTH``; the framework images document the thread counts (``OMP_*``,
``MKL_*``, ``KMP_*``), and ``OPENBLAS_THREAD_TIMEOUT`` undoes a default of shipyard's
own (backends/environment.py). shipyard's own runtime reads ``SHIPYARD_*``."""

INTERPRETER_VARIABLES = (
    "PYTHON*",
    "LD_*",
    "DYLD_*",
    "BASH_ENV",
    "BASH_FUNC_*",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "IFS",
    "SHELL",
    "BROWSER",
    "PAGER",
    "EDITOR",
    "VISUAL",
    "PERL*",
    "RUBY*",
    "NODE_OPTIONS",
    "NODE_PATH",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "MALLOC_*",
    "NLSPATH",
    "LOCPATH",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    "PATH",
    "HOME",
    "TMPDIR",
    "XDG_*",
    "GIT_*",
    "PIP_*",
    "AWS_*",
    "*_PROXY",
    "SSL_CERT_*",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)
"""Variables that make an interpreter, the loader, a shell or a library run code, read
its configuration from elsewhere (``HOME``, ``AWS_CONFIG_FILE``'s
``credential_process``) or send traffic elsewhere (``*_PROXY``): refused in a caller's
``Environment`` whenever ``auth:`` is present, whatever ``allow_commands`` and
``allow_environment`` say (matched without regard to case)."""

GATEWAY_VARIABLES = frozenset(
    {
        ADAPTERS_TOKEN_ENV,
        ADAPTERS_TOKEN_FD_ENV,
        "SHIPYARD_INFERENCE_COMPONENT",
        "SHIPYARD_IMPORTS_FILE",
        "SHIPYARD_INSTANCE_ID",
        "SHIPYARD_MODEL_PREFIX",
        "SHIPYARD_S3_ENDPOINT_URL",
        "SAGEMAKER_BIND_TO_PORT",
        "SHIPYARD_WORKER_SOCKET",
        "SHIPYARD_WORKER_READY",
        "SHIPYARD_WORKER_PEERS",
    }
)
"""The gateway's own variables: what it sets on its instances itself (the adapters
token of a component's copies, which component a copy is, a file it writes, the
instance's id, port, model prefix and S3 endpoint) and on its own worker processes. A
caller's ``Environment`` may never name one, with ``auth:`` or without (check_process):
one that did could, for instance, give another model's instance a code-loading route
with a token of its choosing."""

CODE_VARIABLES = frozenset(
    {"SAGEMAKER_SUBMIT_DIRECTORY", "SAGEMAKER_PROGRAM", "SHIPYARD_INSTALL_REQUIREMENTS"}
)
"""Variables that choose which code a model's instances run (its submit directory, its
entry point, whether its requirements are installed). The model's maker names them on
CreateModel; a call that only uses a model (CreateTransformJob) may not, or a key
allowed only to run transforms would run code of its own choosing."""

LOCATION_VARIABLES = frozenset({"SAGEMAKER_SUBMIT_DIRECTORY", "SHIPYARD_MODEL_CACHE_DIR"})
"""Variables whose value is a location the instance reads or writes: checked against
``file_roots`` like any location."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def wildcard(pattern: str) -> re.Pattern[str]:
    """``pattern`` as a regular expression for the whole string, ``*`` matching any
    characters (``/`` included) and nothing else special: ``?`` and ``[`` are literal."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def _matches(name: str, patterns: Iterable[re.Pattern[str]]) -> bool:
    return any(pattern.fullmatch(name) for pattern in patterns)


_CALLER = tuple(wildcard(p) for p in CALLER_VARIABLES)
_INTERPRETER = tuple(wildcard(p) for p in INTERPRETER_VARIABLES)


def gateway_variable_refusal(name: str) -> str | None:
    """Why no caller may set the variable ``name``, with ``auth:`` or without: it is one
    of the gateway's own (GATEWAY_VARIABLES). None when it is not. ``check_process`` and
    ``shipyard apply``'s check of a stack file (cli/shapes.py) both ask here."""
    if name in GATEWAY_VARIABLES:
        return (
            f"{name!r} is the gateway's own variable, set by the gateway itself; a caller "
            "may never set it."
        )
    return None


def environment_refusal(
    name: str, *, allow_commands: bool, allowed: Iterable[re.Pattern[str]] = ()
) -> str | None:
    """Why a caller may not set the variable ``name`` on a gateway with ``auth:``; None
    when it may.

    Interpreter and loader variables and the gateway's own are refused always; with
    ``allow_commands: false`` anything outside CALLER_VARIABLES and ``allowed`` (the
    operator's ``auth.allow_environment``) is refused too. A caller who may run
    commands could set any other variable in the command itself.
    """
    if not _NAME.fullmatch(name):
        return "is not a valid variable name"
    if _matches(name.upper(), _INTERPRETER):
        return (
            "is an interpreter, loader or shell variable, which can make a process run "
            "code or read settings from elsewhere; a caller may never set it"
        )
    if gateway_variable_refusal(name) is not None:
        return "is set by the gateway itself"
    if allow_commands or _matches(name, _CALLER) or _matches(name, allowed):
        return None
    return (
        "is not a variable a caller may set on this gateway: SageMaker's (SAGEMAKER_*, "
        "SM_*, TS_*, MMS_*, HF_*, thread counts), SHIPYARD_* and auth.allow_environment"
    )


@dataclass(frozen=True, slots=True)
class HostAccess:
    """The host-level powers a caller has; see the module."""

    enforced: bool = False
    """Whether ``auth:`` is present; without it nothing below is checked."""
    allow_commands: bool = True
    """``cmd:`` images and ``ContainerEntrypoint`` may run commands on this host."""
    file_roots: FileRoots | None = None
    """Folders local locations must lie under; None means anywhere (no ``auth:``)."""
    allow_environment: tuple[re.Pattern[str], ...] = ()
    """More variables a caller's ``Environment`` may name (``auth.allow_environment``)."""
    notify_targets: tuple[str, ...] = ()
    """URL patterns a caller's notification targets must match (``auth.notify_targets``)."""
    allow_images: tuple[re.Pattern[str], ...] = ()
    """Container images a caller may run (``auth.allow_images``); none by default."""

    @classmethod
    def from_auth(cls, auth: AuthConfig | None, *, home: Path | None = None) -> HostAccess:
        """``auth``'s rules; ``home``, the gateway's, is never a caller's location."""
        if auth is None:
            return cls()
        return cls(
            enforced=True,
            allow_commands=auth.allow_commands,
            file_roots=FileRoots(auth.file_roots, hidden=() if home is None else (home,)),
            allow_environment=tuple(wildcard(p) for p in auth.allow_environment),
            notify_targets=tuple(auth.notify_targets),
            allow_images=tuple(wildcard(p) for p in auth.allow_images),
        )

    def check_process(
        self,
        *,
        image: str | None = None,
        entrypoint: object = None,
        environment: Mapping[str, object] | None = None,
        image_field: str = "Image",
        entrypoint_field: str = "ContainerEntrypoint",
        environment_field: str = "Environment",
        chooses_code: bool = True,
    ) -> None:
        """Refuse, with InvalidParameter naming the field, a process a caller may not start.

        ``image``: a ``cmd:`` image runs a command, allowed only with ``allow_commands``;
        so is any ``entrypoint``; a container image (``images.runtime_for``) runs outside
        the sandbox, from a registry, allowed only when it matches ``allow_images``.
        ``environment``: each name must pass ``environment_refusal``, and a variable
        naming a location (LOCATION_VARIABLES) must lie under ``file_roots``. The
        ``*_field`` arguments are the request's names for them, as messages show them
        (``Containers.2.Image``). The gateway's own
        variables (GATEWAY_VARIABLES) are refused with ``auth:`` or without.
        """
        if environment is not None and not isinstance(environment, Mapping):
            raise InvalidParameter(f"{environment_field}: a map of names to values is expected.")
        for name in environment or {}:
            if (why := gateway_variable_refusal(str(name))) is not None:
                raise InvalidParameter(f"{environment_field}: {why}")
        if not self.enforced:
            return
        if image and image.startswith("cmd:") and not self.allow_commands:
            raise InvalidParameter(
                f"{image_field}: {image[:80]!r} runs a command on the gateway's host, which "
                "this gateway's auth.allow_commands does not allow."
            )
        if image and runtime_for(image) == "docker" and not _matches(image, self.allow_images):
            raise InvalidParameter(
                f"{image_field}: the container image {image[:200]!r} is not one this "
                "gateway runs for callers (auth.allow_images); use shipyard/python, or ask "
                "the operator to allow the image."
            )
        if entrypoint and not self.allow_commands:
            raise InvalidParameter(
                f"{entrypoint_field}: a container entrypoint runs a command on the gateway's "
                "host, which this gateway's auth.allow_commands does not allow."
            )
        for name, value in (environment or {}).items():
            why = environment_refusal(
                str(name), allow_commands=self.allow_commands, allowed=self.allow_environment
            )
            if why is not None:
                raise InvalidParameter(f"{environment_field}: {str(name)[:80]!r} {why}.")
            if name in CODE_VARIABLES and not chooses_code and not self.allow_commands:
                raise InvalidParameter(
                    f"{environment_field}: {name!r} chooses the code the model runs; only "
                    "the model's own Environment (CreateModel) may set it on this gateway."
                )
            if name in LOCATION_VARIABLES and not _inside_model(str(value)):
                self.check_location(str(value), f"{environment_field}.{name}")

    def check_location(self, uri: str | None, field: str) -> None:
        """Refuse a ``file://`` or plain-path location outside ``file_roots``.

        The location is read by storage's ``local_path``, as the stores open it, and
        checked by the same ``FileRoots`` that guards them (storage/filesystems.py), so
        ``FILE:///x`` or a leading space cannot pass here and open elsewhere there.
        ``s3://`` and what opens no local file are not checked here.
        """
        if self.file_roots is None or not uri:
            return
        try:
            self.file_roots.check_uri(uri)
        except OutsideFileRoots as exc:
            raise InvalidParameter(f"{field}: {exc}") from None

    def check_notify_target(self, target: str, field: str) -> None:
        """Refuse a notification target a caller names that is a URL (an apprise URL, a
        webhook, a mail server) not matching ``auth.notify_targets``.

        Topic names and SNS topic ARNs name the stack file's topics, which are the
        operator's: always allowed (whether they exist is checked elsewhere).
        """
        if not self.enforced or "://" not in target:
            return
        if any(_target_matches(target, p) for p in self.notify_targets):
            return
        raise InvalidParameter(
            f"{field}: the notification target {_masked(target)[:200]!r} is not one this "
            "gateway may notify (auth.notify_targets); name a topic of the stack file."
        )


def _target_matches(target: str, pattern: str) -> bool:
    """Whether a notification ``target`` matches an ``auth.notify_targets`` pattern.

    The whole URL must match, part by part: a ``*`` stands for characters of the part it
    is written in and never reaches into the next. In the host part it matches no
    ``@``, so ``mailto://*@example.com`` does not let through
    ``mailto://a@evil.test/@example.com``; and a target's query (where apprise reads a
    mail server, ``smtp=``, and recipients) must be matched by the pattern's own, so
    neither does it let through ``mailto://a@example.com?smtp=evil.test``. A fragment
    never matches.
    """
    if "#" in target:
        return False
    try:
        got, want = urlsplit(target), urlsplit(pattern)
    except ValueError:
        return False
    parts = (
        (got.scheme, want.scheme, "[^:]*"),
        (got.netloc, want.netloc, "[^@/]*"),
        (got.path, want.path, ".*"),
        (got.query, want.query, ".*"),
    )
    return all(
        re.fullmatch(star.join(re.escape(p) for p in wanted.split("*")), value, re.DOTALL)
        for value, wanted, star in parts
    )


def _inside_model(value: str) -> bool:
    """``/opt/ml/model/code``: the container path of the model's own files, which the
    sagemaker SDK writes into ``SAGEMAKER_SUBMIT_DIRECTORY`` when the code is packed in
    the model; it names the instance's model, not a file of this host."""
    return value.rstrip("/") == MODEL_CODE


def _masked(url: str) -> str:
    """``url`` with the password of its user part masked, for messages."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1****@", url)
