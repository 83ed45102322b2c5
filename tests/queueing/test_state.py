"""The engine's queueing state: a Job claimed before the priority classes were listed gets its priority later."""

from __future__ import annotations

from datetime import UTC, datetime

from dispatcher import workload as wl
from dispatcher.queueing.state import UNRESOLVED, QueueingState

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_priority_resolved_once_the_catalog_is_listed() -> None:
    qs = QueueingState(starvation_seconds=300, max_attempts_per_pass=100)
    qs.catalog.ready = False   # the watcher has not listed the classes yet
    job = {"metadata": {"uid": "u1", "namespace": "default", "name": "j", "creationTimestamp": "2026-01-01T00:00:05Z",
                        "labels": {"kueue.x-k8s.io/priority-class": "urgent"}}}
    podsets = [{"name": "worker", "count": 1, "requests": {"cpu": "1"}}]
    cols = qs.claim_columns(job, {"podsets": podsets}, NOW)
    assert cols["priority_source"] == UNRESOLVED and cols["priority"] == 0
    assert cols["queued_at"] == datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)   # the Job's creationTimestamp
    row = {"uid": "u1", "namespace": "default", "name": "j", "queue": "default", "kind": "PyTorchJob",
           "state": "pending", "suspended": False, "podsets": podsets, "created_at": NOW, **cols}
    qs.sync([row], {"u1": job}, {"u1": wl.need_of("PyTorchJob", podsets)})
    assert qs.reprice() == []                  # still not listed: nothing to say yet
    qs.catalog.apply("WorkloadPriorityClass", {"metadata": {"name": "urgent"}, "value": 500})
    qs.catalog.ready = True
    assert qs.reprice() == [("u1", 500, "WorkloadPriorityClass urgent")]
    assert qs.queues.entries["u1"].priority == 500
    assert qs.reprice() == []
