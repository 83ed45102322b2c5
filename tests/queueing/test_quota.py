"""Cohort arithmetic: borrowing and lending limits, nested cohorts, usage climbing the tree."""

from __future__ import annotations

from decimal import Decimal

from dispatcher.queueing.quota import QuotaTree
from tests.queueing.builders import catalog, cq

D = Decimal
CPU = ("default", "cpu")


def test_borrow_up_to_what_others_leave_and_the_borrowing_limit() -> None:
    tree = QuotaTree(catalog(cq("a", cohort="c", flavors={"default": {"cpu": ("10", "4")}}),
                             cq("b", cohort="c", flavors={"default": {"cpu": ("10", None)}})))
    assert tree.available("a", CPU) == D(14)          # own 10 + at most 4 borrowed
    assert tree.available("b", CPU) == D(20)          # no limit: everything in the cohort
    tree.add("b", {CPU: D(8)})
    assert tree.available("a", CPU) == D(12)          # b uses 8 of the 20: 12 left for a
    tree.add("a", {CPU: D(12)})                       # a borrows 2
    assert tree.available("a", CPU) == D(0)
    assert tree.available("b", CPU) == D(0)
    tree.remove("b", {CPU: D(8)})
    assert tree.available("a", CPU) == D(2)           # the limit: 12 used of 10 + 4
    assert tree.available("b", CPU) == D(8)


def test_lending_limit_keeps_a_guaranteed_part() -> None:
    tree = QuotaTree(catalog(cq("a", cohort="c", flavors={"default": {"cpu": ("10", None, "3")}}),
                             cq("b", cohort="c", flavors={"default": {"cpu": ("0", None)}})))
    assert tree.available("b", CPU) == D(3)           # a lends only 3 of its 10
    assert tree.available("a", CPU) == D(10)
    tree.add("b", {CPU: D(3)})
    assert tree.available("a", CPU) == D(7)
    tree.add("a", {CPU: D(7)})
    assert tree.available("a", CPU) == D(0) and tree.available("b", CPU) == D(0)


def test_nested_cohorts_share_the_parents_own_quota() -> None:
    parent = {"kind": "Cohort", "metadata": {"name": "org"}, "spec": {"resourceGroups": [
        {"coveredResources": ["cpu"], "flavors": [{"name": "default", "resources": [
            {"name": "cpu", "nominalQuota": "5"}]}]}]}}
    child = {"kind": "Cohort", "metadata": {"name": "team"}, "spec": {"parentName": "org"}}
    tree = QuotaTree(catalog(parent, child, cq("a", cohort="team", flavors={"default": {"cpu": "2"}}),
                             cq("b", cohort="org", flavors={"default": {"cpu": "1"}})))
    assert tree.available("a", CPU) == D(8)           # 2 + 1 (b) + 5 (org)
    tree.add("b", {CPU: D(4)})
    assert tree.available("a", CPU) == D(4)
    assert tree.root_of("a") == "org"


def test_cohort_loop_is_cut() -> None:
    a = {"kind": "Cohort", "metadata": {"name": "x"}, "spec": {"parentName": "y"}}
    b = {"kind": "Cohort", "metadata": {"name": "y"}, "spec": {"parentName": "x"}}
    tree = QuotaTree(catalog(a, b, cq("q", cohort="x")))
    assert tree.available("q", CPU) == D(10)
