"""Kueue objects parse from both API versions; bad ones are refused naming the field; priority rules."""

from __future__ import annotations

from decimal import Decimal

import pytest

from dispatcher.queueing import api
from federation.errors import Invalid
from tests.queueing.builders import catalog, cq, flavor, lq


def test_cluster_queue_v1beta2_and_v1beta1_read_the_same() -> None:
    b2 = api.parse_cluster_queue(cq("a", cohort="all", flavors={"f": {"cpu": ("8", "4", "2")}}))
    b1 = api.parse_cluster_queue(cq("a", cohort="all", flavors={"f": {"cpu": ("8", "4", "2")}},
                                    version="kueue.x-k8s.io/v1beta1"))
    assert b2 == b1
    assert b2.cohort == "all"
    quota = b2.resource_groups[0].flavors[0].resources["cpu"]
    assert quota == api.Quota(Decimal(8), Decimal(4), Decimal(2))
    assert b2.strategy == "BestEffortFIFO" and b2.stop_policy == "None"
    assert b2.preemption.within_cluster_queue == "Never"


def test_cohort_parent_both_spellings() -> None:
    assert api.parse_cohort({"metadata": {"name": "c"}, "spec": {"parentName": "p"}}).parent == "p"
    assert api.parse_cohort({"metadata": {"name": "c"}, "spec": {"parent": "p"}}).parent == "p"


@pytest.mark.parametrize(("spec", "field"), [
    ({"queueingStrategy": "LIFO"}, "spec.queueingStrategy"),
    ({"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "f", "resources": [{"name": "cpu", "nominalQuota": "lots"}]}]}]},
     "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota"),
    ({"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "f", "resources": [{"name": "memory", "nominalQuota": "1"}]}]}]},
     "spec.resourceGroups[0].flavors[0].resources[0].name"),
    ({"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "f", "resources": [{"name": "cpu", "nominalQuota": "1", "borrowingLimit": "1"}]}]}]},
     "spec.resourceGroups"),
])
def test_bad_cluster_queue_is_refused_naming_the_field(spec: dict, field: str) -> None:
    with pytest.raises(Invalid) as err:
        api.parse_cluster_queue({"metadata": {"name": "bad"}, "spec": spec})
    assert err.value.field == field
    c = catalog({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                 "metadata": {"name": "bad"}, "spec": spec}, lq("default", "q", "bad"))
    assert "bad" not in c.cluster_queues and field in c.problems[("ClusterQueue", "bad")]
    assert "it was refused" in c.resolve("default", "q").problem


def test_priority_workload_class_then_pod_class_then_zero() -> None:
    c = catalog({"kind": "WorkloadPriorityClass", "metadata": {"name": "urgent"}, "value": 1000},
                {"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 50},
                {"kind": "PriorityClass", "metadata": {"name": "low"}, "value": 5})
    assert c.priority({api.PRIORITY_CLASS_LABEL: "urgent"}, ["high"]) == (1000, "WorkloadPriorityClass urgent")
    assert c.priority({}, ["low", "high"]) == (50, "PriorityClass high")
    assert c.priority({}, []) == (0, "")
    assert c.priority({api.PRIORITY_CLASS_LABEL: "nope"}, ["high"])[0] == 0


def test_resolve_names_each_missing_step() -> None:
    c = catalog(cq("team-a", selector={"matchLabels": {"team": "a"}}), lq("a", "q", "team-a"),
                lq("b", "q", "team-a"), lq("c", "q", "ghost"), flavor("default"),
                namespaces={"a": {"team": "a"}, "b": {"team": "b"}, "c": {}})
    assert c.resolve("a", "q").problem == ""
    assert c.resolve("a", "other").reason == "LocalQueueDoesNotExist"
    assert c.resolve("b", "q").reason == "NamespaceNotAdmitted"
    assert c.resolve("c", "q").reason == "ClusterQueueDoesNotExist"
    null_selector = catalog({**cq("x"), "spec": {**cq("x")["spec"], "namespaceSelector": None}},
                            lq("default", "q", "x"), flavor("default"))
    assert null_selector.resolve("default", "q").reason == "NamespaceNotAdmitted"  # null admits no namespace
    no_flavor = catalog(cq("x"), lq("default", "q", "x"))
    assert no_flavor.resolve("default", "q").reason == "FlavorNotFound"


def test_kueue_crds_ship_both_versions_with_kueues_printer_columns() -> None:
    from federation.kinds.crds import load_crds
    crds = {c["spec"]["names"]["kind"]: c for c in load_crds() if c["spec"]["group"] == "kueue.x-k8s.io"}
    assert set(crds) == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "Cohort", "WorkloadPriorityClass",
                         "Workload", "AdmissionCheck"}
    for kind, crd in crds.items():
        versions = {v["name"]: v for v in crd["spec"]["versions"]}
        assert set(versions) == {"v1beta2", "v1beta1"} and versions["v1beta2"]["storage"], kind
        assert not versions["v1beta1"]["storage"] and versions["v1beta1"]["served"], kind
    assert crds["LocalQueue"]["spec"]["scope"] == "Namespaced"
    columns = [c["name"] for c in crds["ClusterQueue"]["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Cohort", "Strategy", "Pending Workloads", "Admitted Workloads", "Age"]
    assert "subresources" in {k for k in crds["ClusterQueue"]["spec"]["versions"][0]}
