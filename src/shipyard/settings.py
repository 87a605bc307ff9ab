"""Server settings: how this gateway runs. Read once by the CLI and passed down."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shipyard.stackfile import StackFile


class Settings(BaseSettings):
    """How one gateway runs. Fields come from CLI flags, else ``SHIPYARD_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="SHIPYARD_", extra="ignore")

    host: str = "127.0.0.1"
    """Address the gateway binds to."""

    insecure: bool = False
    """Allow a non-loopback ``host`` without an ``auth:`` section in the stack file."""

    port: int = 8080
    """Port the gateway binds to."""

    allow_hosts: list[str] = Field(default_factory=list)
    """More ``Host`` names a gateway without ``auth:`` answers (``--allow-host``, besides
    ``allow_hosts:`` in the stack file): ``NAME`` on any port, or ``NAME:PORT``. Without
    them it answers only localhost, 127.0.0.1 and [::1] on its port (gateway/edge/browser.py)."""

    grpc_port: int | None = None
    """Port of the Open Inference Protocol's gRPC service (``inference.GRPCInferenceService``)
    on ``host``, served in the gateway's process and event loop; None: no gRPC."""

    http2_port: int | None = None
    """Port of the HTTP/2 door for bidirectional streaming
    (InvokeEndpointWithBidirectionalStream) on ``host``: TLS with ALPN ``h2`` when the
    gateway serves TLS, else cleartext HTTP/2 with prior knowledge; None: no HTTP/2 door."""

    bidi_idle_timeout_s: int = Field(default=300, ge=1)
    """A bidirectional stream with no part either way for this many seconds is ended
    (the client gets InternalStreamFailure, the model's input ends)."""

    bidi_max_duration_s: int = Field(default=1800, ge=1)
    """A bidirectional stream is ended this many seconds after it began."""

    bidi_ping_interval_s: float = Field(default=60.0, ge=0.1)
    """A WebSocket stream's instance (a ``cmd:`` server or container image) is pinged this
    often; five pings unanswered end the stream (the client gets InternalStreamFailure)."""

    home: Path = Field(default_factory=lambda: Path("~/.shipyard").expanduser())
    """Holds every piece of state of the embedded default: database, artifacts, logs."""

    workers: int = Field(default=1, ge=1, le=64)
    """Gateway processes serving ``port`` from ``home`` (``shipyard serve --workers``): one
    process's event loop is one core, so more cores serve more requests with more
    workers. Each is a whole gateway on the one store (cli/workers.py)."""

    worker: int | None = Field(default=None, ge=0)
    """This process's index among ``workers``, set by ``shipyard serve --workers`` in each
    worker's environment; None in a gateway started on its own."""

    worker_peers: Path | None = None
    """Where the workers of one ``shipyard serve --workers`` serve their metrics to one
    another (gateway/ops/worker_metrics.py), set with ``worker``; a folder of that run's."""

    db: str | None = None
    """SQLAlchemy URL of the metadata store; default a SQLite file in ``home``."""

    backend: str = "local"
    """Where instances run, a name from the registry in backends/__init__.py: ``local``
    processes (the embedded default), or ``ray`` (the nodes of a Ray cluster)."""

    framework_images: Literal["builtin", "container"] = "builtin"
    """What serves a SageMaker framework image URI (sklearn, pytorch, xgboost,
    huggingface, ...): the built-in Python runtime, or (``container``) the image itself
    on the container engine, for a user who has the real images."""

    ray_address: str | None = None
    """The Ray cluster ``--backend ray`` joins: its head's ``host:port`` (``ray start
    --head`` prints it). A cluster with token authentication also needs its token, which
    Ray reads itself from ``RAY_AUTH_TOKEN`` or ``~/.ray/auth_token``."""

    config: Path | None = None
    """Stack file (YAML) to converge to at start."""

    region: str = "us-east-1"
    """Region written into ARNs."""

    account_id: str = Field(default="000000000000", pattern=r"^\d{12}$")
    """Account id written into ARNs (12 digits). Set it to what your clients' STS says
    (e.g. moto's ``123456789012``) when they build ARNs themselves; also ``account_id:``
    in the stack file, which this setting (flag or ``SHIPYARD_ACCOUNT_ID``) overrides."""

    s3_endpoint_url: str | None = None
    """Endpoint URL for ``s3://`` artifacts (MinIO, a test server); default AWS's."""

    invocation_timeout_s: float = 60.0
    """How long the gateway waits for an instance to answer one invocation."""

    session_ttl_s: float = Field(default=1200.0, ge=1, le=7 * 24 * 3600)
    """How long a stateful session lives from when it opens, in seconds
    from 1 to a week; using it does not extend it. A model's own sessions last as long
    as it says; this is for those the gateway names for a model that names none."""

    session_max_ttl_s: float = Field(default=6 * 3600.0, ge=1, le=7 * 24 * 3600)
    """The longest a model's own session may last, in seconds from when it opens (1 to a
    week): an expiry the model answers later than that is cut to it, so that no session
    holds a place, and its records, for longer."""

    max_sessions: int = Field(default=10_000, ge=1, le=10_000_000)
    """Open sessions per endpoint and gateway: each gateway counts those opened through
    it, so an endpoint served by several may have as many through each; beyond it a
    NEW_SESSION is refused with ThrottlingException."""

    max_payload_bytes: int = 6 * 1024 * 1024
    """Largest request body the runtime accepts (SageMaker's 6 MB)."""

    max_response_bytes: int = 25 * 1024 * 1024
    """Largest answer the gateway takes from an instance for one real-time invocation,
    held whole in memory (SageMaker's 25 MB); a larger one is a ModelError. Asynchronous
    answers are streamed to object storage and have no such limit."""

    body_read_timeout_s: float = 30.0
    """How long a client may take to send a request body; a request waits for no
    instance until its body is in, so a slow client holds only its own connection."""

    max_headers: int = 100
    """Most headers a request may carry; more is answered 431 as they arrive."""

    max_head_bytes: int = 64 * 1024
    """Most bytes a request line and its headers may take; more is answered 431."""

    head_timeout_s: float = 10.0
    """How long a request's head may take to arrive once begun; then 408."""

    idle_timeout_s: float = Field(default=20.0, gt=0)
    """How long a connection may stay open sending nothing, from the moment it opens and
    between requests; then it is closed (SECURITY.md, "Limits against hostile clients")."""

    max_connections: int = Field(default=1000, ge=1)
    """Connections open at once; beyond them a new request is answered 503."""

    tls_cert: Path | None = None
    """PEM certificate (chain) to serve HTTPS with; needs ``tls_key``."""

    tls_key: Path | None = None
    """PEM private key of ``tls_cert``."""

    max_queue_per_instance: int = 64
    """Requests an instance may have outstanding before the gateway answers 503."""

    max_async_queue: int = Field(default=10_000, ge=1)
    """Unfinished (queued or running) asynchronous requests one endpoint may hold, each
    possibly with an inline body of up to 128,000 bytes in the store; beyond it
    InvokeEndpointAsync is answered 503 and nothing is queued."""

    shadow_max_pending_copies: int = Field(default=64, ge=1)
    """Copies of production requests a shadow variant may have sent and not yet answered;
    past it, new copies are dropped and counted (``shipyard_shadow_copies_dropped``), so
    a slow shadow never queues copies (and their bodies) without bound."""

    multi_model_routing: Literal["affinity", "random"] = "affinity"
    """How multi-model endpoints pick an instance: ``affinity`` prefers one that holds the
    TargetModel (routing.policies.ModelAffinity); ``random`` ignores it, the baseline
    bench/multimodel.py compares against."""

    instance_start_timeout_s: float = 600.0
    """How long an instance may take to pass its first ``/ping`` before it is failed."""

    health_check_period_s: float = 2.0
    """How often the reconciler pings every instance."""

    unhealthy_restart_after_s: float = 20.0
    """An instance whose ``/ping`` has failed this long is replaced, even with requests in
    flight (a hung process never answers them); an idle one goes after three failures."""

    drain_timeout_s: float = 30.0
    """How long old instances keep serving in-flight requests after a swap or at stop."""

    max_endpoints: int = 100
    """Quota: endpoints on this gateway."""

    max_instances: int = 64
    """Quota: instances of all endpoints together (what their variants ask for)."""

    max_instance_memory_bytes: int | None = None
    """Quota: memory of all instances together, counted by their InstanceType's memory
    (``src/shipyard/instance_types.py``); default none, since locally a type's memory is
    a label rather than what the instance takes. Set it on a shared host."""

    max_instances_per_variant: int = 16
    """Quota: instances one production variant may ask for."""

    max_active_jobs: int = Field(default=4, ge=1)
    """Quota: long-running jobs active at once, unless the stack file's ``jobs.limit`` says."""

    job_stop_grace_s: float = 120.0
    """StopTrainingJob sends SIGTERM, then SIGKILL after this many seconds (SageMaker's 120)."""

    job_poll_period_s: float = 0.5
    """How often the job supervisor reads the status of running jobs."""

    event_lease_s: float = 30.0
    """How long a dispatcher holds an event it is delivering. Events held by a gateway
    that died are taken again once this has passed."""

    async_lease_s: float = Field(default=30.0, gt=0)
    """How long an asynchronous request a gateway runs stays its own unrenewed. It renews
    the requests it runs every third of this; a killed gateway's are run by another once
    this has passed since (a gateway stopped cleanly gives them back at once)."""

    lease_s: float = Field(default=6.0, gt=0)
    """How long a gateway's lease on an endpoint's fleet, a training job or a transform
    job lasts unrenewed. Gateways sharing a database each run only what they hold the
    lease of; when a holder dies, another takes its leases this long after its last
    renewal, and replaces its fleets and picks up its jobs."""

    lease_renew_s: float = Field(default=1.0, gt=0)
    """How often a holder renews its leases. It stops running what a lease covers once
    the lease has gone ``lease_s - lease_renew_s`` unrenewed, before another gateway may
    take it, so an endpoint never has two fleets; keep it well below ``lease_s``."""

    routes_refresh_s: float = Field(default=0.25, gt=0)
    """How often a gateway reads the routes of fleets other gateways hold (their instances'
    addresses and health), off the request path, to route to the same instances. It
    should be shorter than an instance takes to start, so a gateway sees an endpoint
    being created, and holds requests to it, before a client can see it InService."""

    autoscaling_period_s: float = Field(default=5.0, gt=0)
    """How often scaling policies are evaluated."""

    autoscaling_window_s: float = Field(default=60.0, gt=0)
    """The sliding window invocations per instance are counted over, scaled to a
    minute (CloudWatch's one-minute period)."""

    metrics_retention_days: float = Field(default=15.0, gt=0)
    """How long one-minute CloudWatch datapoints are kept; 10 s ones are
    kept three hours."""

    max_metric_series: int = Field(default=100_000, ge=10)
    """Quota: metric series callers may create with PutMetricData, all together; one key
    may create a tenth of it. The gateway's own recorded series do not count."""

    max_alarms: int = Field(default=5000, ge=10)
    """Quota: CloudWatch alarms, all together; one key may create a tenth of it."""

    metrics_tick_s: float = Field(default=10.0, gt=0, le=10.0)
    """How often the CloudWatch recorder writes what the data path counted, and alarms
    are evaluated; 10 s datapoints need it at most 10."""

    serverless_idle_s: float = Field(default=300.0, ge=0)
    """A serverless instance idle this long is stopped; a model's Environment may say
    otherwise with SHIPYARD_SERVERLESS_IDLE_S."""

    serverless_slots_per_instance: int = Field(default=1, ge=1)
    """Requests one serverless instance serves at a time."""

    warm_spares: int = Field(default=1, ge=0)
    """Built-in runtime processes the local backend keeps started, with the imports of
    the serverless models it has run done, so a serverless cold start skips them
    (runtime/spare.py). Kept only once a serverless instance has started; 0: none."""

    capture_flush_interval_s: float = Field(default=5.0, gt=0)
    """Data capture: how often buffered records are written to their destination (also
    as soon as 1000 wait)."""

    capture_buffer_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    """Data capture: the most captured bodies held in memory before they are written;
    past it, records are dropped and counted (shipyard_capture_records_total)."""

    def with_stack(self, stack: StackFile) -> Settings:
        """These settings with what the stack file sets that they leave to it: its
        ``account_id:``, unless a flag or ``SHIPYARD_ACCOUNT_ID`` gave one.

        Raises:
            ValueError: the two cannot go together (the message names the setting).
        """
        if self.grpc_port is not None and stack.auth is not None:
            raise ValueError(
                "grpc_port: the gRPC door cannot check AWS signatures, and the stack file "
                "has an auth: section; serve the Open Inference Protocol over REST (/v2)."
            )
        if stack.account_id is None or "account_id" in self.model_fields_set:
            return self
        return self.model_copy(update={"account_id": stack.account_id})

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{self.home / 'shipyard.db'}"

    @property
    def identity(self) -> str:
        """Who this gateway is in the store: the owner of its async claims, the holder of
        its fleet leases. Stable across restarts of this gateway (one home serves one
        gateway at a time, or one per worker index: ``home_lock``), so it takes back at
        once what its previous run held. Worker 0 is the gateway a plain start is."""
        identity = f"{socket.gethostname()}:{self.home.resolve()}"
        if self.worker:
            identity += f":worker {self.worker}"
        return hashlib.sha1(identity.encode()).hexdigest()[:16]

    @property
    def run_dir(self) -> Path:
        """Where this gateway records the processes and containers it starts, which its
        next start stops if they outlived it: one per worker, so that no worker stops
        what another one runs."""
        return self.home / (f"run-{self.worker}" if self.worker else "run")

    @property
    def home_lock(self) -> Path:
        """The file a running gateway holds locked, so that no second one (with the same
        identity) serves from ``home`` beside it."""
        return self.home / (f"gateway-{self.worker}.lock" if self.worker else "gateway.lock")
