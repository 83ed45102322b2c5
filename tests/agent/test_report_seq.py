"""Report sequence numbers do not come from the agent's clock.

The dispatcher drops a Status whose ``seq`` is not above the last one it stored for that placement.
An agent restarted with a clock an hour behind must still number its Reports above everything its
previous run sent, or its Reports, the terminal one included, would be dropped as stale.
"""

from __future__ import annotations

import time

import pytest

from federation.kube import CONFIGMAPS
from tests.agent.conftest import AgentHarness, place
from tests.agent.render_harness import example
from tests.agent.test_agent_pytorch import RUN, with_annotations
from worker_agent.seq import EPOCH_KEY, FIRST_EPOCH, epoch_configmap


async def test_a_restarted_agent_with_its_clock_behind_numbers_reports_above_the_old_ones(
        harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    uid = "wl-pytorch-simple"
    await harness.send(place(with_annotations(example("pytorch-simple.yaml"), **{RUN: "4"}), uid=uid))
    await harness.wait_report(lambda r: r.type == "status" and r.placement.workload_uid == uid
                              and r.status.get("startTime"))
    before = max(r.seq for r in harness.reports if r.type in ("accepted", "status"))
    await harness.stop_agent()

    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() - 3600 * 10**9)  # the new run's clock is an hour behind
    seen = len(harness.reports)
    await harness.start_agent()
    done = await harness.wait_report(lambda r: r.type == "status" and r.placement.workload_uid == uid
                                     and r.finished == "Succeeded", after=seen, within=30)
    after = [r.seq for r in harness.reports[seen:] if r.type == "status" and r.placement.workload_uid == uid]
    assert min(after) > before, (before, after)
    assert done.seq == max(after)

    # the epoch lives in the worker cluster (a ConfigMap), one more per start
    cm = await harness.kube.get(CONFIGMAPS, epoch_configmap(harness.settings.cluster_name),
                                harness.settings.namespace)
    assert int(cm["data"][EPOCH_KEY]) == FIRST_EPOCH + 1
