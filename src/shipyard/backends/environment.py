"""The environment an instance or a job starts with: a few plain variables, never the
gateway's own (DESIGN 2.9).

The gateway's environment holds its secrets (the keys of ``auth:``, database URLs,
cloud credentials), and a model's code can read whatever its process was given. So a
process gets only:

- ``PATH`` (to find programs), ``LANG`` / ``LC_ALL`` / ``TZ`` (so text and times read as
  on the host) and ``TMPDIR``, copied when the gateway has them;
- ``HOME``, its own folder, so libraries that cache under ``~`` keep to it;
- ``PYTHONUNBUFFERED``, so its log lines arrive as they are printed;
- S3 credentials only when it reads or writes ``s3://`` itself (a multi-model instance
  with an ``s3://`` prefix, a job that names an ``s3://`` location): the analogue of
  SageMaker's execution role. Then it gets the gateway's ``AWS_*`` credential settings
  and nothing else of it;

and then what its model or job declares (``Environment``), which wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

_PLAIN = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
_S3_CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
    "AWS_ENDPOINT_URL_S3",
)


def process_environment(
    gateway: Mapping[str, str], *, home: Path, s3_access: bool
) -> dict[str, str]:
    """The base environment of one instance or job process; see the module."""
    env = {name: gateway[name] for name in _PLAIN if name in gateway}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    if s3_access:
        env.update({name: gateway[name] for name in _S3_CREDENTIALS if name in gateway})
    return env
