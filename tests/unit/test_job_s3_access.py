"""Which jobs get the gateway's S3 credentials (jobs/supervisor.py ``_opened``): those
that open S3 themselves, not those naming it elsewhere in their request."""

from __future__ import annotations

from shipyard.job_contract import Channel, JobSpec
from shipyard.jobs.supervisor import _opened


def _spec(**kw: object) -> JobSpec:
    given: dict[str, object] = {"output_path": "file:///out", **kw}
    return JobSpec(name="j", arn="arn:j", image="i", started_at=0.0, **given)  # type: ignore[arg-type]


def _s3(spec: JobSpec) -> bool:
    return any(uri.startswith("s3://") for uri in _opened(spec))


def test_a_job_opening_s3_itself_gets_credentials() -> None:
    assert not _s3(_spec())
    assert _s3(_spec(channels=(Channel(name="train", uri="s3://b/train"),)))
    assert _s3(_spec(output_path="s3://b/out"))
    # as the sagemaker SDK writes a hyperparameter: JSON-encoded
    assert _s3(_spec(hyperparameters={"data": '"s3://b/d"'}))
    assert _s3(_spec(environment={"DATA": "s3://b/d"}))
    assert not _s3(_spec(hyperparameters={"note": '"see s3://b in the docs"'}))
