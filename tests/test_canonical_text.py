"""The dedupe key's canonical text is byte for byte what the standard library writes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.general_body import canonical_text

# what _canonical leaves: numbers have become {"#n": text}; strings are any Unicode but lone
# surrogates (refused while parsing), including controls, quotes, backslashes, U+2028
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
CANONICAL = st.recursive(
    st.none() | st.booleans() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=25)


def stdlib(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


@settings(max_examples=2000, deadline=None)
@given(CANONICAL)
def test_canonical_text_equals_the_standard_librarys(value: Any) -> None:
    assert canonical_text(value) == stdlib(value)


def test_keys_sort_by_code_point_also_beyond_the_basic_plane() -> None:
    value = {"\U0001f600": 1, "\uffff": 2, "a": 3, "é": 4, "Z": 5}
    assert canonical_text(value) == stdlib(value)
