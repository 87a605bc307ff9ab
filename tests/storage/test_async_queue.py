"""The asynchronous queue keeps an inline input only while its request is unfinished."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from shipyard.records import AsyncRequest, AsyncStatus
from shipyard.storage import tables as t
from shipyard.storage.async_queue import AsyncQueue
from shipyard.storage.metadata import MetadataStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)
BODY = b"x" * 128_000


def _inline(inference_id: str, *, ttl_s: float = 3600) -> AsyncRequest:
    return AsyncRequest(
        endpoint="ep",
        inference_id=inference_id,
        input_location=None,
        output_location=f"s3://out/{inference_id}.out",
        failure_location=f"s3://out/{inference_id}.err",
        received=NOW,
        expires=NOW + timedelta(seconds=ttl_s),
        invocation_timeout_s=60,
        body=BODY,
    )


def _stored_body(queue: AsyncQueue, inference_id: str) -> bytes | None:
    query = select(t.async_requests.c.body).where(t.async_requests.c.inference_id == inference_id)
    with queue.engine.connect() as conn:
        value = conn.execute(query).scalar_one()
    return None if value is None else bytes(value)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (AsyncStatus.COMPLETED, None),
        (AsyncStatus.FAILED, "ModelError: no"),
        (AsyncStatus.FAILED, "Request expired: it waited 9 s in the queue"),
    ],
)
def test_finishing_a_request_clears_its_inline_body(
    meta: MetadataStore, status: AsyncStatus, reason: str | None
) -> None:
    queue = AsyncQueue(meta.engine)
    queue.enqueue(_inline("one"))
    queue.enqueue(_inline("two"))
    assert _stored_body(queue, "one") == BODY
    [request, _] = queue.claim("ep", owner="gw", limit=2, now=NOW, lease_s=60)

    assert queue.finish(request, status=status, now=NOW, failure_reason=reason)

    assert _stored_body(queue, "one") is None
    finished = queue.get("ep", "one")
    assert finished.status is status and finished.body is None
    assert _stored_body(queue, "two") == BODY  # an unfinished one keeps its input


def test_a_finished_request_is_not_run_again_after_a_restart(meta: MetadataStore) -> None:
    queue = AsyncQueue(meta.engine)
    queue.enqueue(_inline("done"))
    [request] = queue.claim("ep", owner="gw", limit=1, now=NOW, lease_s=60)
    assert queue.finish(request, status=AsyncStatus.COMPLETED, now=NOW)

    # The gateway restarts under the same name, and its lease passes: nothing comes back.
    assert queue.release_owned("gw") == 0
    later = NOW + timedelta(hours=1)
    assert queue.claim("ep", owner="gw", limit=10, now=later, lease_s=60) == []
    assert queue.endpoints_with_work() == []
    # Nor does its inference id queue it again, nor bring its body back.
    again, queued = queue.enqueue(_inline("done"))
    assert not queued and again.status is AsyncStatus.COMPLETED and again.body is None
    assert _stored_body(queue, "done") is None
