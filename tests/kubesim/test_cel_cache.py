"""CRD rules over scalars are answered from a cache of (rule, self, oldSelf): a cached answer must be the one a
fresh evaluation gives, also for values Python calls equal but CEL does not (``1`` and ``true``), and errors
must be cached as errors."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim import cel

pytestmark = pytest.mark.kubesim_only("unit tests of kubesim's CEL result cache; no cluster involved")


def validator(rule: str) -> cel.Validator:
    return cel.Validator.for_schema({"type": "object", "properties": {"v": {
        "x-kubernetes-int-or-string": True, "x-kubernetes-validations": [{"rule": rule}]}}})


def outcome(rule: str, new: Any, old: Any) -> tuple[list[dict[str, str]], list[str]]:
    return validator(rule).validate({"v": new}, None if old is None else {"v": old})


def fresh(rule: str, new: Any, old: Any) -> tuple[list[dict[str, str]], list[str]]:
    cel._RESULTS.clear()
    return outcome(rule, new, old)


def test_cached_answers_match_fresh_ones_for_values_python_calls_equal() -> None:
    rule = "self == 1"
    for first, then in ((True, 1), (1, True), (1, 1.0), ("1", 1)):
        expected = fresh(rule, then, None)
        cel._RESULTS.clear()
        outcome(rule, first, None)  # fills the cache with ``first``
        assert outcome(rule, then, None) == expected, (first, then)


def test_errors_and_transition_rules_come_back_the_same_from_the_cache() -> None:
    erring = "self.size() > 1"  # no size() on an int: an evaluation error, reported as such every time
    expected = fresh(erring, 5, None)
    assert expected[0] and "no such overload" in expected[0][0]["message"]
    assert outcome(erring, 5, None) == expected
    immutable = "self == oldSelf"
    assert fresh(immutable, "a", "b")[0]  # refused
    assert outcome(immutable, "a", "b") == fresh(immutable, "a", "b")
    assert outcome(immutable, "a", "a") == ([], [])
