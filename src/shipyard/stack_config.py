"""The stack file's ``topics:`` and ``jobs:`` sections on a running gateway.

The gateway starts with them from ``--config``; ``shipyard apply`` changes them without a
restart (``GET /stack`` and ``PUT /stack``, gateway/api/stack_config.py). A change takes
effect at once for everything that reads them: the dispatcher's topics, the job
service's templates, white list and limit, and the notify maps of job and transform
announcements.

Each topic, and the ``jobs:`` section as a whole, has an owner: the stack that last put
it, and for what ``--config`` declared, the stack named after that file's stem (so
``serve --config stack.yaml`` and ``apply stack.yaml`` are the same stack). A stack may
change or remove only what it owns, or put what nobody owns, as with the resources it
tags. Changes live in this gateway's memory: a restarted gateway reads ``--config``
again, so point it at the file you apply.

Under ``auth:`` a change's job templates must pass what CreateTrainingJob checks
(``allow_commands``, the environment rule, ``file_roots``): ``PUT /stack``
must not start what no call could. Its topics and notify targets are a stack file's, the
operator's, and stay allowed, as those of the file read at start are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shipyard.errors import InvalidParameter, OwnedElsewhere
from shipyard.events.topics import Topics
from shipyard.jobs.service import JobService
from shipyard.stackfile import JobsConfig, StackFile
from shipyard.transform.service import TransformService


@dataclass(frozen=True)
class StackChange:
    """What one stack asks for: topics to put and remove; the jobs section to put
    (a mapping), remove (``remove_jobs``), or leave (None)."""

    stack: str
    put_topics: dict[str, list[str]]
    remove_topics: list[str]
    jobs: dict[str, Any] | None = None
    remove_jobs: bool = False


class StackConfig:
    """Topics and the jobs section of a running gateway, and who owns each."""

    def __init__(
        self,
        *,
        topics: Topics,
        jobs: JobService,
        transforms: TransformService,
        declared: dict[str, list[str]],
        jobs_declared: bool,
        origin: str | None,
        default_jobs: JobsConfig,
        autoscaling_notify: Sequence[str],
    ) -> None:
        self.topics = topics
        self.jobs = jobs
        self.transforms = transforms
        self._declared = {name: list(urls) for name, urls in declared.items()}
        self._topic_owners: dict[str, str | None] = {name: origin for name in declared}
        self._jobs_owner = origin if jobs_declared else None
        self._default_jobs = default_jobs
        self._autoscaling_notify = list(autoscaling_notify)

    def __repr__(self) -> str:
        return f"StackConfig(topics={sorted(self._declared)!r}, jobs_owner={self._jobs_owner!r})"

    def snapshot(self) -> dict[str, Any]:
        """The sections as a stack file has them, and their owners."""
        return {
            "topics": {name: list(urls) for name, urls in self._declared.items()},
            "topic_owners": dict(self._topic_owners),
            "jobs": self.jobs.config.model_dump(mode="json"),
            "jobs_owner": self._jobs_owner,
        }

    def change(self, change: StackChange) -> dict[str, Any]:
        """Check ``change`` whole (ownership, then the stack file's own rules), then
        make it; InvalidParameter, and nothing changed, when it does not hold."""
        topics = dict(self._declared)
        for name in [*change.put_topics, *change.remove_topics]:
            owner = self._topic_owners.get(name)
            if name in topics and owner not in (None, change.stack):
                raise OwnedElsewhere(f"topic {name} belongs to stack {owner}")
        for name in change.remove_topics:
            topics.pop(name, None)
        topics.update(change.put_topics)
        jobs = self.jobs.config
        if change.jobs is not None or change.remove_jobs:
            if self._jobs_owner not in (None, change.stack):
                raise OwnedElsewhere(f"the jobs section belongs to stack {self._jobs_owner}")
            jobs = self._default_jobs if change.remove_jobs else jobs
        raw = {
            "topics": topics,
            "jobs": change.jobs if change.jobs is not None else jobs.model_dump(),
            "autoscaling": {"notify": self._autoscaling_notify},
        }
        try:
            checked = StackFile.model_validate(raw)
            Topics(checked.topics)  # its own check of the subscribers, as at start
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            message = first["msg"].removeprefix("Value error, ")
            raise InvalidParameter(f"{where}: {message}" if where else message) from exc
        except ValueError as exc:
            raise InvalidParameter(str(exc)) from exc
        self._check_host_access(change, checked)
        # From here on nothing can fail: the swap is all or nothing.
        self.topics.replace(checked.topics)
        self._declared = {name: list(urls) for name, urls in checked.topics.items()}
        for name in change.remove_topics:
            self._topic_owners.pop(name, None)
        for name in change.put_topics:
            self._topic_owners[name] = change.stack
        if change.jobs is not None or change.remove_jobs:
            new_jobs = self._default_jobs if change.remove_jobs else checked.jobs
            self.jobs.config = new_jobs
            self.jobs.announcer.notify = {s: tuple(t) for s, t in new_jobs.notify.items()}
            self.transforms.announcer.notify = dict(self.jobs.announcer.notify)
            self.jobs.live_templates = not change.remove_jobs
            self._jobs_owner = None if change.remove_jobs else change.stack
        return self.snapshot()

    def _check_host_access(self, change: StackChange, checked: StackFile) -> None:
        """A template is checked as CreateTrainingJob checks a request:
        ``PUT /stack`` must not start what no call could. Topics and notify targets are
        a stack file's, the operator's (only a key allowed ``shipyard:PutStack`` puts
        them), and stay allowed as the file read at start is."""
        if change.jobs is not None:
            self.jobs.check_templates(checked.jobs)
