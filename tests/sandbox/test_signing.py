"""The sandbox's signatures against literal known-answer vectors.

Each hex digest below was computed outside Python with
``printf '%s' BODY | openssl dgst -sha256 -hmac KEY`` (for chat, BODY is ``t.rawBody``).
"""

from __future__ import annotations

from decimal import Decimal

from sandbox import jsonenc
from sandbox.signing import chat_headers, chat_signature, general_signature

GENERAL_BODY = b'{"event":"payment.confirmed","amount":1000}'
GENERAL_HEX = "bb57bf066feb429586a1cd368621bc61cae35a858abf5dc9207d4ff2a7e4235a"
CHAT_BODY = b'{"type":"status"}'
CHAT_T = 1767225600
CHAT_HEX = "aa9383287f4290dbd04aa84aa2778ad7e1dda3ce8cf5e06918f2497d977a76dd"
EMPTY_HEX = "8bb990c40a7d61cb97597a942125025be50ac8beb74436e3735b98893a7f6620"
UTF8_BODY_TEXT = '{"amount":12500.50,"reference":"R-ü"}'
UTF8_HEX = "110ce861fd6f4c8e82093a292b1d74f96b424361813bc7ac5fe1776c17b05da3"


def test_general_signature_matches_the_openssl_vector() -> None:
    assert general_signature("whsec-test", GENERAL_BODY) == "sha256=" + GENERAL_HEX


def test_general_signature_of_an_empty_body_matches_the_openssl_vector() -> None:
    assert general_signature(b"k", b"") == "sha256=" + EMPTY_HEX


def test_exact_json_bytes_of_a_decimal_amount_sign_to_the_openssl_vector() -> None:
    """The body is written digit for digit (12500.50, UTF-8) and signed as those bytes."""
    body = jsonenc.encode({"amount": Decimal("12500.50"), "reference": "R-ü"})
    assert body == UTF8_BODY_TEXT.encode("utf-8")
    assert general_signature("whsec-test", body) == "sha256=" + UTF8_HEX


def test_chat_signature_signs_timestamp_dot_body_matching_the_openssl_vector() -> None:
    assert chat_signature("chat-secret-1", CHAT_BODY, CHAT_T) == f"t={CHAT_T},v1={CHAT_HEX}"


def test_chat_headers_carry_delivery_id_attempt_and_user_agent() -> None:
    headers = chat_headers("chat-secret-1", CHAT_BODY, timestamp=CHAT_T, delivery_id="dlv-1",
                           attempt=3)
    assert headers == {
        "Content-Type": "application/json",
        "X-Service-Signature": f"t={CHAT_T},v1={CHAT_HEX}",
        "X-Service-Delivery-Id": "dlv-1",
        "X-Service-Attempt": "3",
        "User-Agent": "service-chat-webhook/1.0",
    }


def test_a_different_secret_gives_a_different_general_signature() -> None:
    assert general_signature("whsec-tesT", GENERAL_BODY) != "sha256=" + GENERAL_HEX
