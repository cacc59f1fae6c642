"""General (system A) signature verification: known answers and every failure mode."""

from __future__ import annotations

import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.general_signature import GeneralSignatureError, verify

# Literal vectors computed with `printf '...' | openssl dgst -sha256 -hmac KEY`, not by the
# code under test. The first is the well-known RFC-style example.
VECTORS = [
    (b"key", b"The quick brown fox jumps over the lazy dog",
     "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"),
    (b"k", b'{"a":1}', "c3a92ff9e274cdcce27a58c15a78ec6dcbbdbd0038a87e7a11baef2028fd8bff"),
    (b"key", b"", "5d5d139563c95b5967b9bd9a8c9b233a9dedb45072794cd232dc1b74832607d0"),
    (b"whsec_test_secret", b"payment.confirmed",
     "d508a56a79fab524f86b66222fb2c965e7c1f2ebd19925465e0d4cec8cb7e85d"),
]


@pytest.mark.parametrize(("secret", "body", "digest"), VECTORS)
def test_known_answer_vectors_verify(secret: bytes, body: bytes, digest: str) -> None:
    verify(body, f"sha256={digest}", secret)
    verify(body, f"sha256={digest.upper()}", secret)  # hex case is not significant


@pytest.mark.parametrize(("secret", "body", "digest"), VECTORS)
def test_a_changed_byte_or_secret_fails(secret: bytes, body: bytes, digest: str) -> None:
    with pytest.raises(GeneralSignatureError) as err:
        verify(body + b" ", f"sha256={digest}", secret)
    assert err.value.reason == "bad_signature"
    with pytest.raises(GeneralSignatureError):
        verify(body, f"sha256={digest}", secret + b"x")


def test_reserialised_json_does_not_verify() -> None:
    """The signature covers the exact bytes: the same JSON with other spacing fails."""
    with pytest.raises(GeneralSignatureError):
        verify(b'{"a": 1}', "sha256=" + VECTORS[1][2], b"k")


@pytest.mark.parametrize(("header", "reason"), [
    (None, "missing_signature"),
    ("", "missing_signature"),
    ("   ", "missing_signature"),
    ("c3a92ff9e274cdcce27a58c15a78ec6dcbbdbd0038a87e7a11baef2028fd8bff", "malformed_signature"),
    ("sha1=c3a92ff9e274cdcce27a58c15a78ec6dcbbdbd0038a87e7a11baef2028fd8bff",
     "malformed_signature"),
    ("sha256=", "malformed_signature"),
    ("sha256=c3a92ff9", "malformed_signature"),
    ("sha256=" + "z" * 64, "malformed_signature"),
    ("sha256=" + "g" * 64, "malformed_signature"),  # the first letter past hex
    ("sha256=" + "0" * 63 + "\u0660", "malformed_signature"),  # a non-ASCII digit
    ("sha256=" + "0" * 65, "malformed_signature"),
    ("sha256=" + "0" * 64, "bad_signature"),
])
def test_refusal_reasons(header: str | None, reason: str) -> None:
    with pytest.raises(GeneralSignatureError) as err:
        verify(b'{"a":1}', header, b"k")
    assert err.value.reason == reason


@given(body=st.binary(max_size=512), header=st.one_of(st.none(), st.text(max_size=100)))
def test_arbitrary_input_only_ever_fails_with_a_reason(body: bytes, header: str | None) -> None:
    try:
        verify(body, header, b"secret")
    except GeneralSignatureError as exc:
        assert exc.reason in {"missing_signature", "malformed_signature", "bad_signature"}


NEAR_MISSES = ["exact", "upper", "short", "long", "flipped", "other_prefix", "spaced_prefix",
               "padded", "garbage"]


def near_miss(kind: str, right: str, garbage: str) -> tuple[str, bool]:
    """A header close to the right one, and whether it should verify."""
    flipped = right[:10] + ("0" if right[10] != "0" else "1") + right[11:]
    return {
        "exact": ("sha256=" + right, True),
        "upper": ("sha256=" + right.upper(), True),
        "padded": (" \tsha256=" + right + " ", True),
        "short": ("sha256=" + right[:-1], False),
        "long": ("sha256=" + right + "0", False),
        "flipped": ("sha256=" + flipped, False),
        "other_prefix": ("SHA256=" + right, False),
        "spaced_prefix": ("sha256 =" + right, False),
        "garbage": ("sha256=" + garbage, False),
    }[kind]


@settings(max_examples=1500, deadline=None)
@given(body=st.binary(max_size=256), secret=st.binary(min_size=1, max_size=32),
       kind=st.sampled_from(NEAR_MISSES),
       garbage=st.text(st.sampled_from("0123456789abcdefgz= \t,\u00e9"), max_size=70))
def test_near_miss_headers_verify_exactly_when_they_carry_the_right_digest(
        body: bytes, secret: bytes, kind: str, garbage: str) -> None:
    """Headers built from the right one: case and surrounding spaces do not matter, any
    other change is refused with a reason, never a crash."""
    header, verifies = near_miss(kind, hmac.digest(secret, body, "sha256").hex(), garbage)
    if verifies:
        verify(body, header, secret)
        return
    with pytest.raises(GeneralSignatureError) as err:
        verify(body, header, secret)
    assert err.value.reason in {"malformed_signature", "bad_signature"}


@settings(max_examples=500, deadline=None)
@given(body=st.binary(max_size=256), secret=st.binary(min_size=1, max_size=32),
       upper=st.booleans())
def test_the_right_digest_verifies_in_either_case(body: bytes, secret: bytes,
                                                  upper: bool) -> None:
    right = hmac.digest(secret, body, "sha256").hex()
    verify(body, "sha256=" + (right.upper() if upper else right), secret)
