"""Bodies undone layer by layer within a bound (pure: answers built in memory)."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.bounded_read import MAX_LAYERS, read_at_most


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def encode(content: bytes, name: str) -> bytes:
    if name == "gzip":
        return gzip.compress(content)
    if name == "deflate":
        return zlib.compress(content)
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # deflate as some servers send it
    return raw.compress(content) + raw.flush()


def read(body: bytes, encoding: str, limit: int, size: int = 7) -> bytes | None:
    chunks = [body[i:i + size] for i in range(0, len(body), size)]
    answer = httpx.Response(200, headers={"content-encoding": encoding} if encoding else {},
                            stream=Chunks(chunks))
    return asyncio.run(read_at_most(answer, limit))


ENCODINGS = st.lists(st.sampled_from(["gzip", "deflate", "raw"]), max_size=MAX_LAYERS)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=2000) | st.integers(0, 3000).map(bytes), ENCODINGS,
       st.integers(0, 3000), st.integers(1, 300))
def test_a_body_is_read_whole_within_the_bound_and_never_past_it(
        content: bytes, names: list[str], limit: int, size: int) -> None:
    body = content
    for name in names:  # applied in the order listed
        body = encode(body, name)
    label = ", ".join("deflate" if name == "raw" else name for name in names)
    expected = content if len(content) <= limit else None
    assert read(body, label, limit, size) == expected


@pytest.mark.parametrize("label", ["br", "gzip, zstd", "compress",
                                   ", ".join(["gzip"] * (MAX_LAYERS + 1))])
def test_an_encoding_not_undone_here_is_a_decoding_error(label: str) -> None:
    """Read as it was, a media was stored still encoded."""
    with pytest.raises(httpx.DecodingError):
        read(b"whatever", label, 1000)


def test_a_body_that_is_not_its_label_is_a_decoding_error() -> None:
    with pytest.raises(httpx.DecodingError):
        read(b"this is not gzip", "gzip", 1000)
    assert read(b"plain", "identity", 1000) == b"plain"
