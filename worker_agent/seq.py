"""Report sequence numbers that order correctly across agent restarts without trusting any clock.

The dispatcher keeps, per placement, the highest ``seq`` it applied and drops a Status that is not
newer. So every Report an agent sends must be numbered above everything any earlier run of that
agent sent. A wall clock cannot promise that (a restarted agent whose clock is behind would have its
Reports, the terminal one included, dropped as stale). Instead each run of the agent takes a
**report epoch**, a counter kept in a ConfigMap of the worker cluster (``mkd-agent-<cluster>-epoch``
in the agent's namespace) and bumped with a compare-and-set update at every start; ``seq`` is
``epoch << 40 | n`` with ``n`` counting from 1 in that run. A later run always has a higher epoch,
so all its numbers are higher, whatever the clocks say. Epochs start at 2**13 so that the first
numbers (2**53) are above the microsecond timestamps older agents used as ``seq`` (below 2**52
until the year 2112): a dispatcher that stored those keeps accepting the new ones.
"""

from __future__ import annotations

import logging
from typing import Any

from federation.clock import Clock
from federation.errors import AlreadyExists, Conflict, Invalid, NotFound, Temporary
from federation.kube import CONFIGMAPS, NAMESPACES, Kube

log = logging.getLogger(__name__)

EPOCH_KEY = "reportEpoch"
FIRST_EPOCH = 1 << 13
SHIFT = 40
"""Bits of ``n`` in a ``seq``: 2**40 Reports per run, 2**23 runs before ``seq`` leaves int64."""


def epoch_configmap(cluster: str) -> str:
    return f"mkd-agent-{cluster}-epoch"


class Sequencer:
    """Strictly increasing report sequence numbers: ``epoch << SHIFT | n`` (see the module docstring)."""

    def __init__(self, epoch: int | None = None) -> None:
        self.epoch = epoch
        self._n = 0

    def next(self) -> int:
        if self.epoch is None:
            raise RuntimeError("no report epoch taken yet: call take_epoch before sending Reports")
        self._n += 1
        if self._n >= 1 << SHIFT:
            raise OverflowError(f"2**{SHIFT} Reports in one run of the agent; restart it for a new epoch")
        return self.epoch << SHIFT | self._n


async def take_epoch(kube: Kube, namespace: str, cluster: str, clock: Clock) -> int:
    """Bump and return this agent's report epoch (created at ``FIRST_EPOCH``); waits out API outages."""
    name = epoch_configmap(cluster)
    delay = 0.2
    while True:
        try:
            return await _bump(kube, namespace, name)
        except Conflict:
            continue  # another run bumped it at the same moment: read again
        except Temporary as exc:
            log.warning("cannot take the report epoch from ConfigMap %s/%s (%s); retrying in %.1fs",
                        namespace, name, exc, delay)
            await clock.sleep(delay)
            delay = min(delay * 2, 10.0)


async def _bump(kube: Kube, namespace: str, name: str) -> int:
    try:
        cm = await kube.get(CONFIGMAPS, name, namespace)
    except NotFound:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": name, "namespace": namespace},
                                "data": {EPOCH_KEY: str(FIRST_EPOCH)}}
        try:
            await kube.create(CONFIGMAPS, body, namespace)
        except NotFound:  # the agent's own namespace is missing (a fresh cluster): make it, then retry
            try:
                await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": namespace}})
            except AlreadyExists:
                pass
            raise Conflict(f"namespace {namespace} created") from None
        return FIRST_EPOCH
    raw = (cm.get("data") or {}).get(EPOCH_KEY, "")
    try:
        current = int(raw)
    except ValueError:
        raise Invalid(f"data.{EPOCH_KEY}", f"ConfigMap {namespace}/{name} holds {raw!r}, not a report epoch",
                      fix="set it to an integer above every epoch used before (each start logs its epoch)") from None
    cm["data"][EPOCH_KEY] = str(current + 1)
    await kube.replace(CONFIGMAPS, cm, namespace)  # carries resourceVersion: a compare-and-set
    return current + 1
