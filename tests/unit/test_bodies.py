"""The one body reader: whole bodies in pieces, the cap (declared or counted), the
deadline, a client that leaves, the drain of a refused body, and the decoding of a
Content-Encoding under the cap. The doors' wording of
each is tested through real gateways (tests/e2e/test_runtime_limits.py and others)."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from shipyard.errors import BodyEncodingError, BodyTimedOut, BodyTooLarge, ClientLeft
from shipyard.http import bodies

SCOPE: dict[str, Any] = {"type": "http"}  # not seen by the edge: read under a deadline


def pieces(*chunks: bytes, then: str = "end", pause_s: float = 0.0) -> Any:
    """A ``receive`` giving ``chunks`` as one body; afterwards it waits ("end") or says
    the client left ("leave")."""
    sent: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    taken: list[int] = []

    async def receive() -> dict[str, Any]:
        if pause_s:
            await asyncio.sleep(pause_s)
        if sent:
            taken.append(len(sent[0]["body"]))
            return sent.pop(0)
        if then == "leave":
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    receive.taken = taken  # type: ignore[attr-defined]
    return receive


def run(reader: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(reader())


def test_a_body_in_pieces_is_read_whole() -> None:
    body = run(lambda: bodies.read_body(SCOPE, pieces(b"ab", b"", b"cd"), max_bytes=4, timeout_s=5))
    assert body == b"abcd"


def test_a_declared_length_over_the_cap_is_refused_unread() -> None:
    receive = pieces(b"x" * 10)
    with pytest.raises(BodyTooLarge) as info:
        run(lambda: bodies.read_body(SCOPE, receive, max_bytes=4, timeout_s=5, declared=10))
    assert info.value.body_left and receive.taken == []


def test_a_body_counted_over_the_cap_says_whether_more_is_coming() -> None:
    with pytest.raises(BodyTooLarge) as info:
        run(lambda: bodies.read_body(SCOPE, pieces(b"abc", b"de", b"f"), max_bytes=4, timeout_s=5))
    assert info.value.body_left and info.value.limit == 4
    with pytest.raises(BodyTooLarge) as info:
        run(lambda: bodies.read_body(SCOPE, pieces(b"abcde"), max_bytes=4, timeout_s=5))
    assert not info.value.body_left


def test_a_body_that_stops_coming_times_out() -> None:
    receive = pieces(b"ab", b"cd")
    receive_first_only = pieces(b"ab", b"more")

    async def stalled() -> dict[str, Any]:
        message: dict[str, Any] = await receive_first_only()
        if message["body"] == b"more":
            await asyncio.Event().wait()
        return message

    with pytest.raises(BodyTimedOut) as info:
        run(lambda: bodies.read_body(SCOPE, stalled, max_bytes=100, timeout_s=0.2))
    assert info.value.timeout_s == 0.2
    assert run(lambda: bodies.read_body(SCOPE, receive, max_bytes=100, timeout_s=0.2)) == b"abcd"


def test_a_client_that_leaves_mid_body() -> None:
    # Two pieces of a body whose third never comes: the client disconnects instead.
    receive = pieces(b"ab", b"cd", then="leave")

    async def cut() -> dict[str, Any]:
        message: dict[str, Any] = await receive()
        message["more_body"] = True
        return message

    with pytest.raises(ClientLeft):
        run(lambda: bodies.read_body(SCOPE, cut, max_bytes=100, timeout_s=5))


def test_drain_stops_at_the_end_the_limit_or_the_deadline() -> None:
    ended = pieces(b"a" * 10, b"b" * 10)
    run(lambda: bodies.drain(ended, max_bytes=100, timeout_s=5))
    assert ended.taken == [10, 10]

    endless = pieces(*[b"c" * 10] * 50)
    run(lambda: bodies.drain(endless, max_bytes=25, timeout_s=5))
    assert endless.taken == [10, 10, 10]

    slow = pieces(*[b"d" * 10] * 50, pause_s=0.05)
    run(lambda: bodies.drain(slow, max_bytes=10_000, timeout_s=0.2))
    assert 1 <= len(slow.taken) < 50


@pytest.mark.parametrize("encoding", [None, b"", b"identity", b"Identity,\tidentity "])
def test_a_body_without_a_coding_is_given_as_it_came(encoding: bytes | None) -> None:
    assert bodies.decoded(b"plain", encoding, max_bytes=5) == b"plain"


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        (b"gzip", gzip.compress),
        (b"X-GZIP", gzip.compress),
        (b"deflate", zlib.compress),
        (b"gzip, identity", gzip.compress),
        (b" gzip\t", gzip.compress),
    ],
)
def test_gzip_and_deflate_are_decoded_up_to_the_cap(
    encoding: bytes, pack: Callable[[bytes], bytes]
) -> None:
    data = b"0123456789" * 100
    assert bodies.decoded(pack(data), encoding, max_bytes=1000) == data
    with pytest.raises(BodyTooLarge) as info:
        bodies.decoded(pack(data), encoding, max_bytes=999)
    assert not info.value.body_left


@pytest.mark.parametrize("encoding", [b"br", b"compress", b"gzip, gzip", b"gzip, br"])
def test_other_codings_are_unsupported(encoding: bytes) -> None:
    with pytest.raises(BodyEncodingError) as info:
        bodies.decoded(gzip.compress(b"x"), encoding, max_bytes=100)
    assert info.value.unsupported


def test_data_not_of_their_coding_are_malformed() -> None:
    packed = gzip.compress(b"x" * 100)
    for data, words in (
        (b"plain", "not valid gzip"),
        (packed[:-4], "ends before its end"),
        (packed + b"\0", "has data after its end"),
    ):
        with pytest.raises(BodyEncodingError, match=words) as info:
            bodies.decoded(data, b"gzip", max_bytes=1000)
        assert not info.value.unsupported


def test_gzip_members_one_after_the_other_are_one_body() -> None:
    # RFC 1952 2.2: what `cat a.gz b.gz`, pigz and bgzip write. The cap counts them all.
    members = gzip.compress(b"a" * 600) + gzip.compress(b"") + gzip.compress(b"b" * 400)
    assert bodies.decoded(members, b"gzip", max_bytes=1000) == b"a" * 600 + b"b" * 400
    with pytest.raises(BodyTooLarge):
        bodies.decoded(members, b"gzip", max_bytes=999)
    for data, words in (
        (members + gzip.compress(b"c")[:-4], "ends before its end"),
        (members + b"\x1f\x8bnot a member", "not valid gzip"),
        (members + b"\0\0", "has data after its end"),
    ):
        with pytest.raises(BodyEncodingError, match=words):
            bodies.decoded(data, b"gzip", max_bytes=2000)
    # deflate (zlib's format) has no members: a second stream is data after its end.
    with pytest.raises(BodyEncodingError, match="has data after its end"):
        bodies.decoded(zlib.compress(b"a") + zlib.compress(b"b"), b"deflate", max_bytes=100)


def test_a_body_is_inflated_no_further_than_the_cap() -> None:
    # 256 MiB of zeros in about 250 KiB of gzip, made without holding them: refused
    # once the cap is passed, having held little more than the cap (inflated whole and
    # measured afterwards, it would peak at 256 MiB).
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    packed = b"".join(packer.compress(chunk) for _ in range(256)) + packer.flush()
    assert len(packed) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            bodies.decoded(packed, b"gzip", max_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
