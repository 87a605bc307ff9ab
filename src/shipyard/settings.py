"""Server settings: how this gateway runs. Read once by the CLI and passed down."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """How one gateway runs. Fields come from CLI flags, else ``SHIPYARD_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="SHIPYARD_", extra="ignore")

    host: str = "127.0.0.1"
    """Address the gateway binds to."""

    port: int = 8080
    """Port the gateway binds to."""

    home: Path = Field(default_factory=lambda: Path("~/.shipyard").expanduser())
    """Holds every piece of state of the embedded default: database, artifacts, logs."""

    db: str | None = None
    """SQLAlchemy URL of the metadata store; default a SQLite file in ``home``."""

    backend: str = "local"
    """Where instances run: ``local`` processes (the embedded default)."""

    config: Path | None = None
    """Stack file (YAML) to converge to at start."""

    region: str = "us-east-1"
    """Region written into ARNs."""

    account_id: str = "000000000000"
    """Account id written into ARNs."""

    s3_endpoint_url: str | None = None
    """Endpoint URL for ``s3://`` artifacts (MinIO, a test server); default AWS's."""

    invocation_timeout_s: float = 60.0
    """How long the gateway waits for an instance to answer one invocation."""

    max_payload_bytes: int = 6 * 1024 * 1024
    """Largest request body the runtime accepts (SageMaker's 6 MB)."""

    max_queue_per_instance: int = 64
    """Requests an instance may have outstanding before the gateway answers 503."""

    instance_start_timeout_s: float = 600.0
    """How long an instance may take to pass its first ``/ping`` before it is failed."""

    health_check_period_s: float = 2.0
    """How often the reconciler pings every instance."""

    drain_timeout_s: float = 30.0
    """How long old instances keep serving in-flight requests after a swap or at stop."""

    max_endpoints: int = 100
    """Quota: endpoints on this gateway."""

    max_instances_per_variant: int = 16
    """Quota: instances one production variant may ask for."""

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{self.home / 'shipyard.db'}"
