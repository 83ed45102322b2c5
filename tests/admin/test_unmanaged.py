"""A Job that names a Kueue queue but has no managedBy gets feedback without mkd claiming it: a Warning
Event on the Job (once), and ``mkctl why`` (database or ``--server``) says mkd does not manage it and how to
fix that. Before, nothing anywhere said why it was never queued (``why`` answered "no workload")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from federation import labels
from federation.kube import EVENTS, Kube
from mkctl.main import app as mkctl_app
from tests.dispatcher.harness import PYTORCHJOBS, eventually, pytorchjob, running, settings

TOKEN = "t0ken"
NOT_MANAGED_REASON = "NotManagedByMultiKueue"


def mkctl(*args: str) -> Any:
    return CliRunner().invoke(mkctl_app, list(args), env={}, catch_exceptions=False)


async def test_a_queued_job_without_managed_by_is_told_why_mkd_leaves_it(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, api_port=0, api_host="127.0.0.1", api_token=TOKEN)
    job = pytorchjob("forgot", managed_by=None)
    job["metadata"]["labels"] = {labels.QUEUE_NAME: "team-a"}

    async def warnings() -> list[dict[str, Any]]:
        return [e for e in (await kube.list(EVENTS, "default")).items
                if e.get("reason") == NOT_MANAGED_REASON and e["involvedObject"]["name"] == "forgot"]

    async with running(s) as d:
        await asyncio.wait_for(d.http.started.wait(), 10)
        await kube.create(PYTORCHJOBS, job, "default")
        await kube.create(PYTORCHJOBS, pytorchjob("plain", managed_by=None), "default")  # no queue: no word
        found = await eventually(warnings, what="the NotManagedByMultiKueue warning")
        assert found[0]["type"] == "Warning"
        message = found[0]["message"]
        assert "kueue.x-k8s.io/queue-name=team-a" in message and "spec.runPolicy.managedBy" in message
        assert labels.MULTIKUEUE in message
        await kube.patch(PYTORCHJOBS, "forgot", {"metadata": {"annotations": {"touched": "1"}}}, "default")
        await asyncio.sleep(1.0)
        assert len(await warnings()) == 1  # said once, not at every change
        server = ("--server", f"http://127.0.0.1:{d.http.port}", "--token", TOKEN)
        for how in (("--database-url", db_url, "--kubeconfig", str(manager)), server):
            out = await asyncio.to_thread(mkctl, "why", "default/forgot", *how)
            assert out.exit_code == 0, out.output
            assert "not managed by mkd" in out.output and "spec.runPolicy.managedBy" in out.output, out.output
    plain = [e for e in (await kube.list(EVENTS, "default")).items if e["involvedObject"]["name"] == "plain"]
    assert plain == []
    written = await kube.get(PYTORCHJOBS, "forgot", "default")
    assert not (written.get("status") or {}).get("conditions")  # mkd claims nothing and writes nothing to it
    assert written["spec"]["runPolicy"].get("managedBy") is None


async def test_the_warning_is_given_once_per_job_not_once_per_dispatcher_process(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """A dispatcher that starts again lists the Jobs it told before: they get no second Warning (the Event is named
    after the Job's uid and the reason, so a second one is the one already there)."""
    s = settings(manager, db_url, mqtt_url, topic_root)

    def queued(name: str) -> dict[str, Any]:
        job = pytorchjob(name, managed_by=None)
        job["metadata"]["labels"] = {labels.QUEUE_NAME: "team-a"}
        return job

    async def warned(name: str) -> int:
        return len([e for e in (await kube.list(EVENTS, "default")).items
                    if e.get("reason") == NOT_MANAGED_REASON and e["involvedObject"]["name"] == name])

    async with running(s):
        await kube.create(PYTORCHJOBS, queued("first"), "default")
        await eventually(lambda: warned("first"), what="the first Job's warning")
    async with running(s):
        await kube.create(PYTORCHJOBS, queued("second"), "default")
        # the second Job's warning comes after the start's list, where the first was seen again
        await eventually(lambda: warned("second"), what="the second Job's warning")
    assert await warned("first") == 1


async def test_the_only_dispatcher_taking_the_lock_is_no_warning(database_url: str, caplog: Any) -> None:
    """A normal PostgreSQL start logged ``WARNING ... this dispatcher is the active one``: only a takeover
    (another replica, or this one, held the lock before) is worth a warning."""
    import logging

    import pytest

    from dispatcher import db
    from dispatcher.replica.leader import Leadership
    from federation.clock import SystemClock
    from tests.dispatcher.harness import settings as dispatcher_settings

    if not database_url.startswith("postgresql"):
        pytest.skip("leader election runs on PostgreSQL only (no PostgreSQL reachable)")
    s = dispatcher_settings(Path("unused"), database_url, "mqtt://127.0.0.1:1", "t", origin="mkd-leader-log")
    engine = db.make_engine(database_url)
    try:
        first = Leadership(s, engine, SystemClock())
        with caplog.at_level(logging.INFO, logger="dispatcher.replica.leader"):
            assert await first.acquire(asyncio.Event())
        said = [(r.levelno, r.getMessage()) for r in caplog.records if "active one" in r.getMessage()]
        assert said and all(level == logging.INFO for level, _ in said), said
        await first.release()
    finally:
        await engine.dispose()
