"""The queueing demo set (``mkctl demo --examples demo/queues``) loads: Kueue objects and four Jobs."""

from __future__ import annotations

from pathlib import Path

from dispatcher.queueing.catalog import Catalog
from federation.kinds.registry import by_api
from mkctl.jobs import load_examples

DEMO = Path(__file__).resolve().parents[2] / "demo" / "queues"


def test_demo_queues_set_parses_and_resolves() -> None:
    found = load_examples(DEMO)
    assert sorted(s.key for s in found.samples) == ["team-a/high", "team-a/low-1", "team-a/low-2", "team-b/borrower"]
    assert {s.expect for s in found.samples} == {"Succeeded"}
    assert {"team-a", "team-b"} <= found.namespaces
    catalog = Catalog()
    for obj in found.queue_objects:
        catalog.apply(obj["kind"], obj)
    for ns in ("team-a", "team-b"):
        catalog.apply("Namespace", {"metadata": {"name": ns}})
    assert not catalog.problems
    assert catalog.cohort_chain(catalog.cluster_queues["team-b"]) == ["org"]
    for sample in found.samples:
        kind = by_api(sample.manifest["apiVersion"], sample.kind)
        assert kind is not None and kind.validate(sample.manifest) == []
        queue = sample.manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        assert catalog.resolve(sample.namespace, queue).problem == ""
        assert catalog.priority(sample.manifest["metadata"]["labels"], [])[0] in (10, 1000)
