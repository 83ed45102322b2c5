"""The demo's federation for end-to-end tests, and a bounded wait that says what it was waiting for.

Each test gets its own :class:`~mkctl.topology.Topology` (kubesim manager + three workers, dispatcher, three
agents) on the shared ``mqtt_url`` / ``database_url`` / ``topic_root`` fixtures: real Mosquitto and PostgreSQL
when reachable, the embedded broker and SQLite otherwise. Tests drive it through the manager cluster's API
only (``top.manager``, a ``federation.kube.Kube``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from federation import labels
from federation.errors import FederationError, NotFound
from federation.kinds.registry import KINDS, by_api
from federation.kube import NODES, Kube, Resource, resource_for
from federation.podset import Resources, add, fits, parse_resources
from mkctl import jobs
from mkctl.topology import Topology, TopologyOptions
from tests.realcluster import parse_kubeconfigs, skip_on_real_clusters

REAL = os.environ.get("MKD_TEST_KUBECONFIGS")

T = TypeVar("T")

WAIT_SECONDS = 60.0
"""Every wait in the suite is bounded by this; a hang fails with what was last seen."""


class NotYet(str):
    """What a probe returns while the condition does not hold: the words for what is still missing."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REAL:
        skip_on_real_clusters(items, "e2e", "MKD_TEST_KUBECONFIGS")


@pytest.fixture
async def federation(tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str) -> AsyncIterator[Topology]:
    """Real clusters instead of kubesim: ``MKD_TEST_KUBECONFIGS=manager=/p/m.kubeconfig,worker-1=/p/w1.kubeconfig,...``
    (the dispatcher and the agents still run here, against those API servers, with ServiceAccount tokens bound
    to deploy/'s roles, as on kubesim). Then only ``realcluster`` tests run; the others skip saying what they
    would need (tests/realcluster.py). There every object a test creates through the topology's clients is
    deleted again when it ends (the workers' copies go with their manager Jobs, whatever is left of them with
    mkd's labels is deleted too), so a second run finds the clusters as the first did; Namespaces and CRDs
    stay. :func:`adapt_to_capacity` sets what a sample should end as from the workers' nodes (kubesim's or real):
    a job that fits no worker is expected to wait, saying why, not to run (no GPU is assumed).
    """
    options = TopologyOptions(
        state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url, topic_root=topic_root,
        heartbeat_seconds=1.0, heartbeat_timeout_seconds=3.0, origin="mkd-e2e",
        kubeconfigs={k: Path(v) for k, v in parse_kubeconfigs(REAL).items()} if REAL else None,
    )
    async with Topology(options) as top:
        created = track_creations(top) if REAL else []
        try:
            yield top
            top.check_running()  # a service that crashed during the test fails it, with its cause
            await check_not_forbidden(top)
        finally:
            if REAL:
                await clean_up(top, created)


Created = list[tuple[str, Resource, str | None, str]]


def track_creations(top: Topology) -> Created:
    """Every object the test creates through the topology's clients, as (cluster, resource, namespace, name);
    Namespaces are not kept (a second run reuses them; one being deleted would refuse its objects)."""
    created: Created = []
    for cluster, kube in top.kubes.items():
        original = kube.create

        async def create(res: Resource, body: Any, namespace: str | None = None, *, _create: Any = original,
                         _cluster: str = cluster) -> dict[str, Any]:
            obj: dict[str, Any] = await _create(res, body, namespace)
            meta = obj.get("metadata") or {}
            if res.kind != "Namespace":
                created.append((_cluster, res, meta.get("namespace"), str(meta.get("name"))))
            return obj
        kube.create = create  # type: ignore[method-assign]
    return created


async def clean_up(top: Topology, created: Created) -> None:
    """Delete what the test created (newest first), wait for the dispatcher to take the workers' copies away,
    then delete whatever of this origin is still on a worker."""
    for cluster, res, namespace, name in reversed(created):
        try:
            await top.kubes[cluster].delete(res, name, namespace)
        except NotFound:
            pass
        except FederationError as exc:
            print(f"clean-up: could not delete {res.kind} {namespace}/{name} on {cluster}: {exc}")
    selector = f"{labels.ORIGIN}={top.options.origin}"
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        left = []
        for worker in top.worker_names:
            for kind in KINDS:
                try:
                    items = (await top.kubes[worker].list(resource_for(kind), label_selector=selector)).items
                except (NotFound, FederationError):
                    continue  # the kind is not installed there
                left += [(worker, resource_for(kind), i["metadata"]) for i in items]
        if not left or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    for worker, res, meta in left:
        with contextlib.suppress(NotFound):
            await top.kubes[worker].delete(res, meta["name"], meta.get("namespace"))


async def node_capacity(kube: Kube) -> list[Resources]:
    """What each schedulable node of a cluster can hold (its allocatable)."""
    nodes = (await kube.list(NODES)).items
    return [parse_resources((n.get("status") or {}).get("allocatable"), "status.allocatable") for n in nodes
            if not (n.get("spec") or {}).get("unschedulable")]


def fits_on(sample: jobs.Sample, nodes: list[Resources], runtimes: list[dict[str, Any]]) -> bool:
    """Could a worker with ``nodes`` hold the whole job (every pod on some node, the total in the cluster)?"""
    kind = by_api(sample.manifest["apiVersion"], sample.kind)
    if kind is None:
        return True
    ref = ((sample.manifest.get("spec") or {}).get("runtimeRef") or {}).get("name")
    runtime = next((r for r in runtimes if r["metadata"]["name"] == ref), None)
    try:
        podsets = kind.podsets(sample.manifest, runtime) if runtime is not None else kind.podsets(sample.manifest)
    except (FederationError, TypeError, KeyError):
        return True  # not computable here: the dispatcher decides
    total: Resources = {}
    for node in nodes:
        total = add(total, node)
    need: Resources = {}
    for podset in podsets:
        need = add(need, podset.total())
        if podset.count and not any(fits(podset.requests, node) for node in nodes):
            return False
    return fits(need, total)


async def adapt_to_capacity(top: Topology, samples: list[jobs.Sample],
                            runtimes: list[dict[str, Any]] | None = None) -> list[jobs.Sample]:
    """``samples`` with what each should end as on these workers' nodes: a job expected to succeed that fits
    no worker is expected ``Pending`` (the dispatcher says why) instead (real clusters need have no GPU)."""
    capacity = {w: await node_capacity(top.kubes[w]) for w in top.worker_names}
    out = []
    for sample in samples:
        if sample.expect == "Succeeded" and not any(fits_on(sample, nodes, runtimes or [])
                                                    for nodes in capacity.values()):
            sample = jobs.Sample(sample.manifest, sample.source, "Pending")
        out.append(sample)
    return out

async def check_not_forbidden(top: Topology) -> None:
    """A service refused by its deploy/ roles degrades rather than stops: its /readyz says so, and so does
    the test (the rule to add is in the line)."""
    refused = {service: [line for line in lines if "forbidden" in line]
               for service, lines in (await top.degraded()).items()}
    refused = {service: lines for service, lines in refused.items() if lines}
    assert not refused, f"side work refused by deploy/'s RBAC: {refused}"


async def wait_for(probe: Callable[[], Awaitable[T | NotYet | None]], what: str, *, within: float = WAIT_SECONDS,
                   top: Topology | None = None, every: float = 0.25) -> T:
    """Poll ``probe`` until it returns something truthy that is not :class:`NotYet`; fail naming ``what``
    and the last thing seen."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        if top is not None:
            top.check_running()
        last = await probe()
        if last and not isinstance(last, NotYet):
            return last  # type: ignore[no-any-return]
        await asyncio.sleep(every)
    pytest.fail(f"timed out after {within:.0f}s waiting for {what}; last seen: {last!r}"[:2000])
