"""federation.jsoncopy: exact deep copies of JSON data, and a deepcopy for what JSON cannot hold."""

from __future__ import annotations

from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from federation.jsoncopy import json_copy

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@given(JSON)
def test_json_values_are_copied_exactly_and_deeply(value: Any) -> None:
    copied = json_copy(value)
    assert copied == value and type(copied) is type(value)
    if isinstance(value, dict | list) and value:
        assert copied is not value


def test_the_copy_shares_nothing() -> None:
    job = {"spec": {"template": {"containers": [{"name": "c", "env": []}]}}}
    copied = json_copy(job)
    copied["spec"]["template"]["containers"][0]["env"].append({"name": "X"})
    assert job["spec"]["template"]["containers"][0]["env"] == []


def test_what_json_cannot_hold_is_deep_copied() -> None:
    for value in ({1: "int key"}, {"big": 2**70}, OrderedDict(a=[1]), {"at": datetime(2026, 1, 1, tzinfo=UTC)}):
        copied = json_copy(value)
        assert copied == value and type(copied) is type(value)
