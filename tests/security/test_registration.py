"""Cluster registration: `mkctl keys|clusters register|unregister|refused`, and a running dispatcher
that hears a cluster once it is registered (and refuses it, shown, before)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from dispatcher import db
from dispatcher.db import models as m
from federation.kube import Kube
from mkctl.main import app
from tests import keys
from tests.dispatcher.harness import FakeAgent, eventually, running, settings
from tests.dispatcher.test_flow import rows

runner = CliRunner()


def mkctl(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={}, catch_exceptions=False)
    return result.exit_code, result.output


def test_keys_register_and_refused_from_the_command_line(sqlite_url: str, tmp_path: Path) -> None:
    db.upgrade(sqlite_url)
    code, out = mkctl("keys", "generate", "--out", str(tmp_path / "k"))
    assert code == 0 and (tmp_path / "k").stat().st_mode & 0o077 == 0
    public = out.split("public:")[1].strip()
    code, out = mkctl("keys", "public", "--private-key-file", str(tmp_path / "k"))
    assert code == 0 and out.strip() == public
    code, out = mkctl("clusters", "register", "edge-1", "--public-key", "not-a-key", "--database-url", sqlite_url)
    assert code != 0 and "--public-key" in out
    code, out = mkctl("clusters", "register", "Edge_1", "--public-key", public, "--database-url", sqlite_url)
    assert code != 0 and "NAME" in out
    code, out = mkctl("clusters", "register", "edge-1", "--public-key", public, "--database-url", sqlite_url)
    assert code == 0 and "registered" in out
    code, out = mkctl("clusters", "refused", "--database-url", sqlite_url)
    assert code == 0 and "No sender was refused" in out
    code, out = mkctl("clusters", "unregister", "edge-1", "--database-url", sqlite_url)
    assert code == 0
    code, out = mkctl("clusters", "unregister", "edge-1", "--database-url", sqlite_url)
    assert code != 0 and "no registered key" in out


async def test_an_unregistered_cluster_is_refused_and_shown_then_heard_once_registered(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, cluster_keys_refresh_seconds=0.2)
    async with running(s) as d, FakeAgent("edge-7", mqtt_url, topic_root, beat_every=0.2):
        assert d.engine is not None

        async def shown() -> bool:
            return any(r.name == "edge-7" and r.count >= 1 for r in await rows(db_url, m.cluster_refusals))
        await eventually(shown, what="edge-7 shown as refused")
        assert "edge-7" not in d.engine.book.heartbeats
        assert not [c for c in await rows(db_url, m.clusters) if c.name == "edge-7"]  # not created
        code, out = await asyncio.to_thread(mkctl, "clusters", "refused", "--database-url", db_url)
        assert code == 0 and "edge-7" in out and "unregistered" in out
        code, out = await asyncio.to_thread(mkctl, "clusters", "list", "--database-url", db_url)
        assert code == 0 and "edge-7" in out and "refused" in out
        code, _ = await asyncio.to_thread(mkctl, "clusters", "register", "edge-7", "--public-key",
                                          keys.public("edge-7"), "--database-url", db_url)
        assert code == 0
        await eventually(lambda: "edge-7" in d.engine.book.heartbeats, what="edge-7 heard")  # type: ignore[union-attr]
