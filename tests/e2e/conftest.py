"""The demo's federation for end-to-end tests, and a bounded wait that says what it was waiting for.

Each test gets its own :class:`~mkctl.topology.Topology` (kubesim manager + three workers, dispatcher,
three agents) on the shared ``mqtt_url`` / ``database_url`` / ``topic_root`` fixtures: real Mosquitto
and PostgreSQL when reachable, the embedded broker and SQLite otherwise. Tests drive it through the
manager cluster's API only (``top.manager``, a ``federation.kube.Kube``).

Real clusters instead of kubesim: ``MKD_TEST_KUBECONFIGS=manager=/p/m.kubeconfig,worker-1=/p/w1.kubeconfig,...``
(the dispatcher and the agents still run here, against those API servers). Then only ``realcluster`` tests
run; the others skip saying why (tests/realcluster.py), most because pods on a test cluster may never run.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

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
    options = TopologyOptions(
        state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url, topic_root=topic_root,
        heartbeat_seconds=1.0, heartbeat_timeout_seconds=3.0, origin="mkd-e2e",
        kubeconfigs={k: Path(v) for k, v in parse_kubeconfigs(REAL).items()} if REAL else None,
    )
    async with Topology(options) as top:
        yield top
        top.check_running()  # a service that crashed during the test fails it, with its cause
        await check_not_forbidden(top)


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
