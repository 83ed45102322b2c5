"""A publish that crashes is surfaced, not dropped (per-item tasks were bare create_tasks).

The outbox's publishes are tasks of a Supervisor task set: a failure the broker link does not explain
is logged with its traceback, counted on the ``outbox`` task, fails that task (restarted by the
Supervisor), and the Command, still unsent in the database, goes out after the restart."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from federation.kube import Kube
from federation.mqtt import MqttLink
from tests.dispatcher.harness import (
    PYTORCHJOBS,
    FakeAgent,
    eventually,
    is_place,
    pytorchjob,
    running,
    settings,
)


async def test_a_publish_that_crashes_is_logged_counted_and_sent_after_the_restart(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="federation.tasks")
    real = MqttLink.publish
    crashed: list[str] = []

    async def flaky(self: MqttLink, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if topic.endswith("/commands") and is_place(payload) and not crashed:
            crashed.append(topic)
            raise RuntimeError("a bug while publishing")
        await real(self, topic, payload, retain=retain)

    monkeypatch.setattr(MqttLink, "publish", flaky)
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        await kube.create(PYTORCHJOBS, pytorchjob("once-crashed"), "default")
        await eventually(lambda: agent.places(), within=30, what="the Place sent after the outbox restarted")
        assert crashed
        assert d.supervisor is not None
        outbox = d.supervisor.tasks["outbox"]
        assert outbox.child_failures == 1 and outbox.restarts >= 1
        assert "a bug while publishing" in str(outbox.last_error)
    assert any(r.getMessage().startswith("task outbox/publish-") and r.exc_info for r in caplog.records)
