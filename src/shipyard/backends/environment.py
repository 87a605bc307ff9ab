"""The environment an instance or a job starts with: a few plain variables, never the
gateway's own (SECURITY.md, "Secrets stay secret").

The gateway's environment holds its secrets (the keys of ``auth:``, database URLs,
cloud credentials), and a model's code can read whatever its process was given. So a
process gets only:

- ``PATH`` (to find programs), ``LANG`` / ``LC_ALL`` / ``TZ`` (so text and times read as
  on the host), ``TMPDIR`` (so temporary files go where the operator put them) and
  ``PYTHONPATH`` (so the built-in runtime and the job runner import shipyard as the
  gateway did, when it runs from a source tree), copied when the gateway has them;
- ``HOME``, its own folder, so libraries that cache under ``~`` keep to it, and so it
  never reads the gateway user's ``~/.aws`` or other dotfiles;
- ``PYTHONUNBUFFERED``, so its log lines arrive as they are printed;
- ``OPENBLAS_THREAD_TIMEOUT=4``, so that OpenBLAS (numpy's and scipy's BLAS in their
  wheels) puts its threads to sleep as soon as a call ends. By default each of them spins
  about a tenth of a second after every multi-threaded call, waiting for the next: on a
  machine where the gateway and other instances share the cores, that spinning takes
  the core the gateway needs to feed the instance. A transform job scoring a million CSV
  lines in 32 payloads spent 2.5 of its instance's 8 CPU seconds spinning and ran 8 %
  slower for it (bench/results/transform_throughput.md); the threads still share the
  work of each call. The price is a wake-up per call: back-to-back products of
  128x128 matrices took 1.1-1.2x as long in most paired runs here (2x in one), 200x200
  the same. A model that wants the spinning back sets ``OPENBLAS_THREAD_TIMEOUT`` in its
  ``Environment``;
- ``MALLOC_MMAP_THRESHOLD_=33554432`` and ``MALLOC_TRIM_THRESHOLD_=33554432``, so that
  glibc serves buffers under 32 MiB from its heap and keeps up to 32 MiB of it free
  between requests. By default it maps a large buffer afresh and unmaps it when freed
  (or trims the heap past twice the largest buffer's size), and an invocation with a
  6 MB body makes several (the body, the model's copies of it, its arrays), each faulted
  in again page by page. A one-instance transform job of 32 such payloads took 3,400-4,400
  page faults a payload in its instance, 400-600 with these, and its gaps between
  payloads shrank (bench/results/transform_throughput.md). The price: up to 32 MiB more
  resident after a large request, per thread that allocated (glibc's arenas: an instance
  with handler threads keeps that much for each); a multi-model instance trims its heap
  around each load, so a model's measured size is still its own, and when it unloads
  one. Setting either variable turns glibc's own adjustment of both off, so a model's
  ``Environment`` can change them (on a gateway without ``auth:``; with it, ``MALLOC_*``
  are loader variables no caller may set: host_access.py) but not restore that;
- S3 access only when it reads or writes ``s3://`` itself (a multi-model instance with an
  ``s3://`` prefix, a job that names an ``s3://`` location): the analogue of SageMaker's
  execution role. Then it gets the credentials the gateway itself resolved at start, as
  plain ``AWS_*`` variables (never its profile or credential files, which may hold
  other profiles), and the S3 endpoint;

and then what its model or job declares (``Environment``), which wins. Container images
get none of this base, only their own ``Environment``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from pathlib import Path

import botocore.exceptions
import botocore.session

log = logging.getLogger(__name__)

_PLAIN = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH")
_IDLE_THREADS_SLEEP = {"OPENBLAS_THREAD_TIMEOUT": "4"}
"""OpenBLAS's threads wait 2**4 cycles, its least, for the next call before they sleep
(the default is 2**28, about 0.1 s): see the module."""
_LARGE_BUFFERS_KEPT = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "33554432"}
"""glibc's heap serves buffers under 32 MiB and keeps 32 MiB free: see the module."""


def process_environment(
    gateway: Mapping[str, str], *, home: Path, s3: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The base environment of one instance or job process; see the module.

    ``s3``: the S3 variables (``s3_variables``) for a process that uses ``s3://``.
    """
    env = {name: gateway[name] for name in _PLAIN if name in gateway}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(_IDLE_THREADS_SLEEP)
    env.update(_LARGE_BUFFERS_KEPT)
    env.update(s3 or {})
    return env


def s3_variables(
    gateway: Mapping[str, str],
    *,
    s3_endpoint_url: str | None,
    callers_keys: Collection[str] = (),
) -> dict[str, str]:
    """The gateway's own S3 access, as explicit variables for a process that uses s3://.

    Resolved once, at start, the way boto3 would (environment, then profile and its
    files), but without asking the metadata services of EC2 and ECS: a gateway on a cloud
    instance does not lend that instance's role to its models unasked. Credentials that
    expire (an assumed role, SSO) are handed over as they are at start; a gateway that
    needs longer should be given plain keys.

    Credentials whose access key id is one of ``callers_keys`` (the ``auth.keys`` callers
    sign with) are never lent: a model or job would hold that caller's powers on the
    gateway itself (an operator who exported their own key for the CLI in the shell that
    started the gateway). The processes then get no S3 credentials, and the gateway says
    so once.
    """
    env: dict[str, str] = {}
    try:
        session = botocore.session.Session()
        resolver = session.get_component("credential_provider")
        for provider in ("container-role", "iam-role"):
            resolver.remove(provider)
        credentials = session.get_credentials()
        region = session.get_config_variable("region")
    except botocore.exceptions.BotoCoreError as exc:
        log.warning("no S3 credentials for instances and jobs: %s", exc)
        credentials, region = None, None
    frozen = credentials.get_frozen_credentials() if credentials is not None else None
    if frozen is not None and frozen.access_key in callers_keys:
        log.warning(
            "the gateway's AWS credentials are auth key %s: not lent to instances and "
            "jobs, which get no S3 credentials; start the gateway with credentials of "
            "their own for S3",
            frozen.access_key,
        )
        frozen = None
    if frozen is not None:
        env["AWS_ACCESS_KEY_ID"] = frozen.access_key
        env["AWS_SECRET_ACCESS_KEY"] = frozen.secret_key
        if frozen.token:
            env["AWS_SESSION_TOKEN"] = frozen.token
    if region:
        env["AWS_DEFAULT_REGION"] = env["AWS_REGION"] = str(region)
    if "AWS_CA_BUNDLE" in gateway:
        env["AWS_CA_BUNDLE"] = gateway["AWS_CA_BUNDLE"]  # to trust a private S3 endpoint
    if s3_endpoint_url:
        env["SHIPYARD_S3_ENDPOINT_URL"] = s3_endpoint_url
    return env
