"""The chat (system B) signature: known answers, every refusal reason, tolerance edges.

Every digest below is a literal computed outside the code under test, with
``printf '%s' '<t>.<body>' | openssl dgst -sha256 -hmac <key>``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.chat_signature import ChatSignatureError, parse_header, verify

KEY = b"whsec_chat_test_key"
OLD_KEY = b"whsec_chat_old_key"
T = 1700000000
BODY = b'{"a":1}'
# printf '%s' '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_chat_test_key
V1 = "a15a3ff6767e666f5a85b90d9cd35bb599f398b611ac2f6ba1d755c81e7649b4"
# printf '1700000000.\xff\xfe\x00{"a":1}' | openssl dgst -sha256 -hmac whsec_chat_test_key
V1_BINARY = "f17e9163dcccb22f0af1c7e20b7b87bd822291bb4de79322ece0357757555b26"
# printf '%s' '1700000000.' | openssl dgst -sha256 -hmac whsec_chat_test_key
V1_EMPTY = "c1db993c4c5cd0d10962d7de9b8fcce84c5a64b27ff1a41083d73f323914ee47"
# printf '%s' '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_chat_old_key
V1_OLD = "58a5cf45d6a2dcd4c0d7a9c6d56c2c409e2043447ddd11f118279bc8f84b15d5"
# printf '%s' '01700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_chat_test_key
V1_LEADING_ZERO = "79c0b9287870647b3a99f4c464fa6ed9634ac33df0d17cd73a156f771d3f6635"
# printf '%s' '1700000000.{"a": 1}' | openssl dgst -sha256 -hmac whsec_chat_test_key
V1_SPACED = "ca4f58bf6dd51c0f9df6668bdc1ff50e8609e14feab3f44c54f7be7927e080e9"

SECRETS = [("current", KEY)]
TOLERANCE = 300


def check(body: bytes, header: str | None, secrets: list[tuple[str, bytes]] = SECRETS,
          now: float = T) -> str:
    return verify(body, header, secrets, now=now, tolerance_s=TOLERANCE)


def reason(body: bytes, header: str | None, secrets: list[tuple[str, bytes]] = SECRETS,
           now: float = T) -> str:
    with pytest.raises(ChatSignatureError) as caught:
        check(body, header, secrets, now)
    return caught.value.reason


@pytest.mark.parametrize(("body", "header"), [
    (BODY, f"t={T},v1={V1}"),
    (b'\xff\xfe\x00{"a":1}', f"t={T},v1={V1_BINARY}"),
    (b"", f"t={T},v1={V1_EMPTY}"),
    (BODY, f"v1={V1},t={T}"),
    (BODY, f" t={T} , v1={V1} "),
    (BODY, f"t={T},v1={V1.upper()}"),
    (b'{"a": 1}', f"t={T},v1={V1_SPACED}"),
])
def test_known_answer_vectors_verify(body: bytes, header: str) -> None:
    """Independently computed digests verify: bytes hashed as sent, any order, either case."""
    assert check(body, header) == "current"


def test_the_timestamp_is_signed_as_sent_including_leading_zeros() -> None:
    assert check(BODY, f"t=01700000000,v1={V1_LEADING_ZERO}") == "current"
    assert reason(BODY, f"t=01700000000,v1={V1}") == "bad_signature"


def test_a_body_that_differs_by_one_byte_is_refused() -> None:
    assert reason(b'{"a": 1}', f"t={T},v1={V1}") == "bad_signature"
    assert reason(b'{"a":2}', f"t={T},v1={V1}") == "bad_signature"


def test_a_signature_for_another_timestamp_is_refused() -> None:
    assert reason(BODY, f"t={T + 1},v1={V1}", now=T) == "bad_signature"


def test_the_label_of_the_verifying_secret_is_returned() -> None:
    secrets = [("new", KEY), ("old", OLD_KEY)]
    assert check(BODY, f"t={T},v1={V1}", secrets) == "new"
    assert check(BODY, f"t={T},v1={V1_OLD}", secrets) == "old"
    assert reason(BODY, f"t={T},v1={V1_OLD}", [("new", KEY)]) == "bad_signature"


@pytest.mark.parametrize(("header", "expected"), [
    (None, "missing_signature"),
    ("", "missing_signature"),
    ("  \t ", "missing_signature"),
    (f"v1={V1}", "missing_timestamp"),
    (f"t={T}", "missing_v1"),
    (f"t={T},v1=", "missing_v1"),
    (f"t={T},t={T},v1={V1}", "duplicate_timestamp"),
    (f"t={T},v1={V1},v1={V1}", "multiple_v1"),
    (f"t={T},v1={V1_OLD},v1={V1}", "multiple_v1"),
    (f"t={T},v1={V1},junk", "malformed_signature"),
    (f"t,v1={V1}", "malformed_signature"),  # a key without "=" is not an empty value
    (f"t={T},v1", "malformed_signature"),
    (f"T={T},v1={V1}", "malformed_signature"),  # keys are case-sensitive
    (f"t={T},V1={V1}", "malformed_signature"),
    ("\n", "malformed_signature"),  # only spaces and tabs are blanks
    (f"t={T},v1={V1},", "malformed_signature"),
    (f"t={T},v0={V1},v1={V1}", "malformed_signature"),
    (f"t={T};v1={V1}", "malformed_timestamp"),  # one item whose t is junk
    (f"x={T};v1={V1}", "malformed_signature"),
    (f"=x,t={T},v1={V1}", "malformed_signature"),
    (f"sha256={V1}", "malformed_signature"),
    (f"t=,v1={V1}", "malformed_timestamp"),
    (f"t=-1700000000,v1={V1}", "malformed_timestamp"),
    (f"t=1700000000.5,v1={V1}", "malformed_timestamp"),
    (f"t=1e9,v1={V1}", "malformed_timestamp"),
    (f"t=١٧٠٠٠٠٠٠٠٠,v1={V1}", "malformed_timestamp"),  # non-ASCII digits
    (f"t={'9' * 13},v1={V1}", "malformed_timestamp"),
    (f"t={T},v1={'z' * 64}", "malformed_v1"),
    (f"t={T},v1={V1[:-1]}g", "malformed_v1"),
    (f"t={T},v1=zz", "malformed_v1"),  # not hex, whatever its length
    (f"t={T},v1={V1}z", "malformed_v1"),
    (f"t={T},v1={V1[:-2]}", "wrong_length_v1"),
    (f"t={T},v1={V1}00", "wrong_length_v1"),
    (f"t={T},v1={V1[:32]}", "wrong_length_v1"),
])
def test_every_malformed_header_has_its_own_reason(header: str | None, expected: str) -> None:
    assert reason(BODY, header) == expected


@pytest.mark.parametrize("header", [
    f"t={T},v1={V1}\n", f"t={T}\r,v1={V1}", f"\u00a0t={T},v1={V1}", f"t={T},v1={V1}\x0b"])
def test_whitespace_other_than_spaces_and_tabs_around_an_item_is_refused(header: str) -> None:
    """Only spaces and tabs are trimmed around items; any other whitespace is content."""
    assert reason(BODY, header) in {"malformed_signature", "malformed_timestamp",
                                    "malformed_v1"}


def test_a_twelve_digit_timestamp_is_the_longest_accepted() -> None:
    """Twelve digits parse; the thirteenth is refused (see the malformed cases)."""
    assert parse_header(f"t={'9' * 12},v1={V1}").timestamp == 10**12 - 1


def test_a_zero_tolerance_accepts_only_the_exact_second() -> None:
    """A tolerance of zero is allowed and means no skew at all, in either direction."""
    assert verify(BODY, f"t={T},v1={V1}", SECRETS, now=T, tolerance_s=0) == "current"
    for now in (T + 1, T - 1, T + 0.5):
        with pytest.raises(ChatSignatureError) as caught:
            verify(BODY, f"t={T},v1={V1}", SECRETS, now=now, tolerance_s=0)
        assert caught.value.reason == "stale_timestamp"


def test_no_secrets_is_refused_not_accepted() -> None:
    assert reason(BODY, f"t={T},v1={V1}", secrets=[]) == "no_secrets"


def test_parse_header_keeps_the_timestamp_text_and_lowercases_the_digest() -> None:
    parsed = parse_header(f"v1={V1.upper()},t=0042")
    assert parsed.timestamp_text == "0042" and parsed.timestamp == 42
    assert parsed.digest_hex == V1


@pytest.mark.parametrize(("now", "fresh"), [
    (T, True),
    (T + 300, True),          # exactly at the edge, past: inclusive
    (T + 300.0001, False),    # just outside, past
    (T + 301, False),
    (T - 300, True),          # exactly at the edge, future (sender clock ahead): inclusive
    (T - 300.0001, False),    # just outside, future
    (T - 301, False),
    (T + 299.9999, True),
    (T - 299.9999, True),
])
def test_tolerance_is_inclusive_at_its_edge_in_both_directions(now: float, fresh: bool) -> None:
    if fresh:
        assert check(BODY, f"t={T},v1={V1}", now=now) == "current"
    else:
        assert reason(BODY, f"t={T},v1={V1}", now=now) == "stale_timestamp"


def test_a_forged_signature_with_a_stale_timestamp_is_a_bad_signature() -> None:
    """Age is judged only for genuine digests, so stale never describes a forgery."""
    assert reason(BODY, f"t={T},v1={V1_OLD}", now=T + 10_000) == "bad_signature"


def test_a_nan_clock_fails_closed() -> None:
    assert reason(BODY, f"t={T},v1={V1}", now=float("nan")) == "stale_timestamp"


def test_a_negative_tolerance_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        verify(BODY, f"t={T},v1={V1}", SECRETS, now=T, tolerance_s=-1)


@settings(max_examples=400, deadline=None)
@given(header=st.one_of(st.none(), st.text(max_size=200),
                        st.builds(lambda a, b: f"t={a},v1={b}", st.text(max_size=20),
                                  st.text(max_size=80))),
       body=st.binary(max_size=300),
       now=st.floats(allow_nan=True, allow_infinity=True))
def test_arbitrary_headers_and_bodies_raise_only_chat_signature_error(
        header: str | None, body: bytes, now: float) -> None:
    try:
        label = verify(body, header, [("a", KEY), ("b", OLD_KEY)], now=now,
                       tolerance_s=TOLERANCE)
    except ChatSignatureError as exc:
        assert exc.reason in {
            "missing_signature", "malformed_signature", "duplicate_timestamp", "multiple_v1",
            "missing_timestamp", "malformed_timestamp", "missing_v1", "malformed_v1",
            "wrong_length_v1", "bad_signature", "stale_timestamp"}
    else:  # only possible if hypothesis forged an HMAC: it cannot
        pytest.fail(f"verified by {label}")


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=500), t=st.integers(min_value=0, max_value=10**12 - 1),
       skew=st.integers(min_value=-TOLERANCE, max_value=TOLERANCE))
def test_any_body_signed_by_a_standard_hmac_verifies_within_tolerance(
        body: bytes, t: int, skew: int) -> None:
    import hashlib
    import hmac
    digest = hmac.new(KEY, str(t).encode() + b"." + body, hashlib.sha256).hexdigest()
    assert verify(body, f"t={t},v1={digest}", SECRETS, now=t + skew,
                  tolerance_s=TOLERANCE) == "current"
