"""StackConfig: the topics and jobs sections of a running gateway, changed by their owners."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shipyard.errors import InvalidParameter, OwnedElsewhere
from shipyard.events.kinds import Announcer, training_job_event
from shipyard.events.topics import Topics
from shipyard.host_access import HostAccess
from shipyard.jobs.service import JobService
from shipyard.stack_config import StackChange, StackConfig
from shipyard.stackfile import AccessKey, AuthConfig, JobsConfig

TEMPLATE = {
    "AlgorithmSpecification": {"TrainingImage": "shipyard/python"},
    "HyperParameters": {"sagemaker_program": "run.py"},
}


def config(origin: str | None = "site") -> tuple[StackConfig, Topics, Any, Any]:
    """A StackConfig as ``serve --config site.yaml`` builds it: topic ``done``, type ``a``."""
    topics = Topics({"done": ["json://127.0.0.1:9/x"]})
    jobs_config = JobsConfig(
        white_list=["a"],
        s3_bucket="file:///out",
        templates={"a": TEMPLATE},
        notify={"Completed": ["done"]},
    )
    jobs = SimpleNamespace(
        config=jobs_config,
        announcer=SimpleNamespace(notify={}),
        host_access=HostAccess(),
        check_templates=lambda config: None,
        live_templates=False,
    )
    transforms = SimpleNamespace(announcer=SimpleNamespace(notify={}))
    stack = StackConfig(
        topics=topics,
        jobs=jobs,  # type: ignore[arg-type]
        transforms=transforms,  # type: ignore[arg-type]
        declared={"done": ["json://127.0.0.1:9/x"]},
        jobs_declared=True,
        origin=origin,
        default_jobs=JobsConfig(limit=4),
        autoscaling_notify=[],
    )
    return stack, topics, jobs, transforms


def test_the_config_file_s_stack_owns_what_it_declared() -> None:
    stack, *_ = config()
    snapshot = stack.snapshot()
    assert snapshot["topic_owners"] == {"done": "site"}
    assert snapshot["jobs_owner"] == "site"
    assert snapshot["jobs"]["templates"] == {"a": TEMPLATE}


def test_a_change_by_the_owner_takes_effect_everywhere_at_once() -> None:
    stack, topics, jobs, transforms = config()
    jobs_section = {
        "limit": 2,
        "white_list": ["a", "b"],
        "s3_bucket": "file:///out",
        "templates": {"a": TEMPLATE, "b": TEMPLATE},
        "notify": {"Failed": ["alerts"]},
    }
    stack.change(
        StackChange(
            stack="site",
            put_topics={"alerts": ["json://127.0.0.1:10/y"]},
            remove_topics=["done"],
            jobs=jobs_section,
        )
    )
    assert topics.names == ["alerts"]
    assert jobs.config.limit == 2 and jobs.config.white_list == ["a", "b"]
    assert jobs.announcer.notify == {"Failed": ("alerts",)}
    assert transforms.announcer.notify == {"Failed": ("alerts",)}
    assert stack.snapshot()["topic_owners"] == {"alerts": "site"}


def test_another_stack_may_not_touch_what_it_does_not_own() -> None:
    stack, topics, jobs, _ = config()
    with pytest.raises(OwnedElsewhere, match="topic done belongs to stack site"):
        stack.change(StackChange("other", {"done": ["json://127.0.0.1:1/z"]}, []))
    with pytest.raises(OwnedElsewhere, match="topic done belongs to stack site"):
        stack.change(StackChange("other", {}, ["done"]))
    with pytest.raises(OwnedElsewhere, match="the jobs section belongs to stack site"):
        stack.change(StackChange("other", {}, [], remove_jobs=True))
    # A topic nobody has is anyone's to put.
    stack.change(StackChange("other", {"new": ["json://127.0.0.1:1/z"]}, []))
    assert topics.names == ["done", "new"]
    assert jobs.config.white_list == ["a"]


def test_a_change_that_breaks_the_file_s_rules_changes_nothing() -> None:
    stack, topics, jobs, _ = config()
    before = stack.snapshot()
    # jobs.notify still names "done": removing it alone is refused, whole.
    with pytest.raises(InvalidParameter, match="jobs.notify.Completed: unknown topic 'done'"):
        stack.change(StackChange("site", {"extra": ["json://127.0.0.1:1/z"]}, ["done"]))
    with pytest.raises(InvalidParameter, match="not an apprise URL"):
        stack.change(StackChange("site", {"done": ["nope"]}, []))
    assert stack.snapshot() == before
    assert topics.names == ["done"]


def test_removing_the_jobs_section_brings_back_the_defaults() -> None:
    stack, _, jobs, _ = config()
    stack.change(StackChange("site", {}, ["done"], remove_jobs=True))
    assert jobs.config == JobsConfig(limit=4)
    assert jobs.announcer.notify == {}
    assert stack.snapshot()["jobs_owner"] is None and stack.snapshot()["topics"] == {}


def guarded_jobs(config: JobsConfig) -> JobService:
    """A JobService under ``auth:`` with ``allow_commands: false``; never reaches a store."""
    key = AccessKey(access_key_id="AKIATEST", secret_access_key_env="X")
    return JobService(
        store=None,  # type: ignore[arg-type]
        config=config,
        announcer=Announcer(training_job_event, notify={}),
        wake=lambda: None,
        jobs_dir=Path("/nonexistent"),
        region="us-east-1",
        account_id="123456789012",
        host_access=HostAccess.from_auth(
            AuthConfig(keys=[key], notify_targets=["json://127.0.0.1:*"])
        ),
    )


def test_under_auth_a_live_change_is_checked_as_the_calls_it_stands_for() -> None:
    """Finding 4: templates as CreateTrainingJob."""
    stack, topics, _, transforms = config()
    jobs = guarded_jobs(stack.jobs.config)
    stack.jobs = jobs
    before = stack.snapshot()
    cmd = {"AlgorithmSpecification": {"TrainingImage": "cmd:id"}}
    section = {"white_list": ["a"], "s3_bucket": "s3://b/out", "templates": {"a": cmd}}
    with pytest.raises(InvalidParameter, match=r"jobs\.templates\.a: .*allow_commands"):
        stack.change(StackChange("site", {}, [], jobs=section))
    section["templates"] = {"a": {**TEMPLATE, "Environment": {"LD_PRELOAD": "/x.so"}}}
    with pytest.raises(InvalidParameter, match=r"jobs\.templates\.a: .*'LD_PRELOAD'"):
        stack.change(StackChange("site", {}, [], jobs=section))
    assert stack.snapshot() == before and not jobs.live_templates
    # Topics and notify targets are a stack file's, the operator's: not held to
    # auth.notify_targets, which is for the targets callers name.
    section["templates"] = {"a": TEMPLATE}
    section["notify"] = {"Failed": ["done", "http://10.0.0.1/hook"]}
    stack.change(StackChange("site", {"x": ["mailto://a@b.example"]}, [], jobs=section))
    assert jobs.live_templates and topics.names == ["done", "x"]


def test_a_job_from_a_live_template_is_checked_again_when_it_starts() -> None:
    """However a template got in, a live one starts no job CreateTrainingJob would refuse."""
    cmd = {"AlgorithmSpecification": {"TrainingImage": "cmd:id"}}
    jobs = guarded_jobs(JobsConfig(white_list=["a"], s3_bucket="s3://b/out", templates={"a": cmd}))
    jobs.live_templates = True
    with pytest.raises(InvalidParameter, match="allow_commands"):
        jobs.submit("a")


def test_a_template_of_the_wrong_shape_is_refused_not_failed_on() -> None:
    jobs = guarded_jobs(JobsConfig())
    for template in ({"Environment": ["PATH=/x"]}, {"AlgorithmSpecification": "cmd:id"}):
        config = JobsConfig(s3_bucket="s3://b/out", templates={"a": template})
        with pytest.raises(InvalidParameter, match=r"jobs\.templates\.a: "):
            jobs.check_templates(config)
