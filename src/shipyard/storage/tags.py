"""Tags: key/value pairs per resource ARN, as SageMaker keeps them (AddTags, ListTags,
DeleteTags, and Tags on Create calls).

Terraform, CDK, the SDK and cost-allocation scripts tag everything they create. Keyed by
ARN rather than by resource, so one table serves models, endpoint configs, endpoints and
training jobs alike, with SageMaker's limit of 50 per resource; key and value lengths
and patterns are checked against botocore's model before an action runs. A resource's
tags go when it does (``Tagging.forget``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Engine, delete, func, select

from shipyard.errors import InvalidParameter, ResourceNotFound
from shipyard.storage import tables as t
from shipyard.storage.transactions import transaction, upsert

MAX_TAGS = 50
"""SageMaker's limit of tags per resource."""


class TagStore:
    """Adds, lists and deletes the tags of resources."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"TagStore({self.engine.url.render_as_string(hide_password=True)!r})"

    def add(self, arn: str, tags: dict[str, str]) -> None:
        """Set ``tags`` on ``arn`` (a key already there takes the new value).

        Raises:
            InvalidParameter: the resource would have more than MAX_TAGS tags.
        """
        if not tags:
            return
        with transaction(self.engine) as conn:
            rows = [{"arn": arn, "key": k, "value": v} for k, v in tags.items()]
            insert = upsert(self.engine.dialect.name, t.tags)
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=[t.tags.c.arn, t.tags.c.key],
                    set_={"value": insert.excluded.value},
                ),
                rows,
            )
            count = conn.execute(
                select(func.count()).select_from(t.tags).where(t.tags.c.arn == arn)
            ).scalar_one()
            if count > MAX_TAGS:  # raising rolls the whole call back
                raise InvalidParameter(
                    f"Resource {arn} would have {count} tags, more than the limit of {MAX_TAGS}."
                )

    def get(self, arn: str) -> list[tuple[str, str]]:
        """The tags of ``arn``, by key."""
        query = select(t.tags.c.key, t.tags.c.value).where(t.tags.c.arn == arn)
        with transaction(self.engine) as conn:
            return [(k, v) for k, v in conn.execute(query.order_by(t.tags.c.key))]

    def delete(self, arn: str, keys: list[str] | None = None) -> None:
        """Remove ``keys`` from ``arn`` (keys it does not have are ignored); all if None."""
        query = delete(t.tags).where(t.tags.c.arn == arn)
        if keys is not None:
            query = query.where(t.tags.c.key.in_(keys))
        with transaction(self.engine) as conn:
            conn.execute(query)


TAGGABLE = (
    "model",
    "endpoint-config",
    "endpoint",
    "inference-component",
    "training-job",
    "transform-job",
)
"""The resource kinds in ARNs (``arn:aws:sagemaker:<region>:<account>:<kind>/<name>``)."""

_KIND_WORDS = {
    "model": "model",
    "endpoint-config": "endpoint configuration",
    "endpoint": "endpoint",
    "inference-component": "inference component",
    "training-job": "training job",
    "transform-job": "transform job",
}


class Tagging:
    """Tags of the resources its services track, by ARN.

    Each service that owns a taggable kind says so when it is built (``track``), with
    the call that lists its resources: the tags of an ARN are served only while a
    resource of that ARN exists.
    """

    def __init__(self, *, store: TagStore) -> None:
        self.store = store
        self._listed: dict[str, Callable[[], Iterable[Any]]] = {}

    def track(self, kind: str, listed: Callable[[], Iterable[Any]]) -> None:
        """Resources of ``kind`` (an ARN's resource type) are those ``listed()`` returns
        (each with an ``arn``)."""
        self._listed[kind] = listed

    def exists(self, kind: str, arn: str) -> bool:
        """Whether a resource of ``kind`` has ``arn`` (ARNs lower-case names: by ARN)."""
        listed = self._listed.get(kind)
        return listed is not None and any(resource.arn == arn for resource in listed())

    def __repr__(self) -> str:
        return f"Tagging({self.store!r})"

    def add(
        self, arn: str, tags: Sequence[dict[str, Any]] | None, *, checked: bool = False
    ) -> None:
        """Set ``tags`` (``[{"Key", "Value"}]``) on ``arn``; ``checked``: it exists."""
        if not tags:
            return
        if not checked:
            self._check(arn)
        pairs: dict[str, str] = {}
        for tag in tags:
            pairs[str(tag["Key"])] = str(tag.get("Value", ""))
        self.store.add(arn, pairs)

    def get(self, arn: str) -> list[dict[str, str]]:
        self._check(arn)
        return [{"Key": k, "Value": v} for k, v in self.store.get(arn)]

    def delete(self, arn: str, keys: Sequence[str]) -> None:
        self._check(arn)
        self.store.delete(arn, list(keys))

    def forget(self, arn: str) -> None:
        """The resource is gone: so are its tags."""
        self.store.delete(arn)

    def _check(self, arn: str) -> None:
        parts = arn.split(":", 5)
        kind, _, name = parts[5].partition("/") if len(parts) == 6 else ("", "", "")
        if parts[:3] != ["arn", "aws", "sagemaker"] or kind not in TAGGABLE or not name:
            raise InvalidParameter(
                f"{arn} is not the ARN of a SageMaker model, endpoint configuration, "
                "endpoint, inference component, training job or transform job."
            )
        if not self.exists(kind, arn):
            raise ResourceNotFound.of(_KIND_WORDS[kind], arn)
