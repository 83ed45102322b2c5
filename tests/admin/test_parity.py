"""Every read verb answers the same through every surface, on one federation: the demo topology (kubesim
manager + three workers, dispatcher with its API, agents, the examples and demo/queues' ClusterQueues).

Each verb runs through mkctl reading the database (with ``--kubeconfig`` for the manager), through mkctl
with ``--server``, and as the HTTP API's JSON; the answers must be equal (the same columns and values in
the tables too). The dashboard's pages must show the same values. The federation keeps moving (jobs
finish), so a pair that differs is read again, a few times, before the test says they disagree.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from mkctl import jobs
from mkctl.demo import submit
from mkctl.main import app as mkctl_app
from mkctl.topology import MANAGER, Topology, TopologyOptions

VOLATILE = re.compile(r"heartbeat \d+s ago|\"heartbeat_age_seconds\": [0-9.]+|\b\d+(s|m|h|d)\b")
"""What may differ between two reads a moment apart: ages, computed as each answer is printed."""


@pytest.fixture
async def federation(tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str
                     ) -> AsyncIterator[Topology]:
    options = TopologyOptions(state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url,
                              topic_root=topic_root, heartbeat_seconds=2.0, heartbeat_timeout_seconds=10.0,
                              origin="mkd-parity")
    async with Topology(options) as top:
        await top.wait_for_clusters()
        examples = jobs.load_examples()
        examples.add(jobs.load_examples(jobs.queues_dir()))
        await submit(top, examples)
        yield top


def mkctl(*args: str) -> Any:
    return CliRunner().invoke(mkctl_app, list(args), env={}, catch_exceptions=False)


def _masked(text: str) -> str:
    return VOLATILE.sub("<age>", text)


async def _agree(what: str, reads: list[Callable[[], str]], tries: int = 6) -> str:
    """The answers of ``reads`` (run one after the other) once they are equal; fails naming ``what``."""
    seen: list[str] = []
    for _ in range(tries):
        seen = [_masked(await asyncio.to_thread(read)) for read in reads]
        if all(s == seen[0] for s in seen):
            return seen[0]
        await asyncio.sleep(1.0)
    import difflib

    diff = difflib.unified_diff(seen[0].splitlines(), seen[1].splitlines(), "database", "--server", lineterm="")
    raise AssertionError(f"{what}: the surfaces disagree:\n" + "\n".join(diff))


@pytest.mark.slow
async def test_every_read_verb_answers_the_same_through_every_surface(federation: Topology) -> None:
    info = federation.describe()
    base, token = info["api_url"], info["api_token"]
    database = ("--database-url", info["database_url"])
    kubeconfig = ("--kubeconfig", info["kubeconfigs"][MANAGER])
    server = ("--server", base, "--token", token)
    headers = {"Authorization": f"Bearer {token}"}

    def api(path: str, **params: Any) -> Any:
        response = httpx.get(f"{base}/api/v1{path}", params=params, headers=headers, timeout=30)
        assert response.status_code == 200, (path, response.text)
        return response.json()

    def cli(*args: str, db_args: tuple[str, ...] = ()) -> Callable[[], str]:
        def read_db() -> str:
            out = mkctl(*args, *database, *db_args)
            assert out.exit_code == 0, (args, out.output)
            return str(out.output)
        return read_db

    def via_server(*args: str) -> Callable[[], str]:
        def read() -> str:
            out = mkctl(*args, *server)
            assert out.exit_code == 0, (args, out.output)
            return str(out.output)
        return read

    # wait until the examples have moved: too-large pending, something finished, the queue jobs admitted
    deadline = time.monotonic() + 90
    while True:
        states = {i["name"]: i["state"] for i in (await asyncio.to_thread(api, "/workloads"))["items"]}
        if states.get("too-large") == "pending" and "finished" in states.values() and "low-1" in states:
            break
        assert time.monotonic() < deadline, states
        await asyncio.sleep(1.0)

    verbs: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
        ("workloads list", ("workloads", "list"), ()),
        ("workloads list --queue", ("workloads", "list", "--queue", "team-a"), ()),
        ("workloads show", ("workloads", "show", "default/pytorch-simple"), kubeconfig),
        ("workloads show (other controller)", ("workloads", "show", "default/other-controller"), kubeconfig),
        ("workloads pending", ("workloads", "pending"), ()),
        ("clusters list", ("clusters", "list"), ()),
        ("clusters refused", ("clusters", "refused"), ()),
        ("events", ("events", "--limit", "40"), ()),
        ("events --for", ("events", "--for", "default/pytorch-simple"), ()),
        ("queues list", ("queues", "list"), kubeconfig),
        ("queues show", ("queues", "show", "team-a"), kubeconfig),
        ("why (pending)", ("why", "default/too-large"), kubeconfig),
        ("why (admitted or finished)", ("why", "default/pytorch-simple"), kubeconfig),
        ("why (other controller)", ("why", "default/other-controller"), kubeconfig),
        ("handover status", ("handover", "status"), ()),
        ("handover report", ("handover", "report"), ()),
    ]
    checked = []
    for what, args, extra in verbs:
        for fmt in ("table", "json") if args[0] == "why" else ("table", "wide", "json"):
            await _agree(f"{what} -o {fmt}", [cli(*args, "-o", fmt, db_args=extra), via_server(*args, "-o", fmt)])
        checked.append(what)

    # the API's own JSON is what --server printed: the same items
    listed = json.loads((await asyncio.to_thread(mkctl, "workloads", "list", "-o", "json", *database)).output)["items"]
    from_api = (await asyncio.to_thread(api, "/workloads"))["items"]
    assert [w["uid"] for w in listed] == [w["uid"] for w in from_api]
    clusters = json.loads((await asyncio.to_thread(mkctl, "clusters", "list", "-o", "json", *server)).output)["items"]
    assert all(c["cpu_free"] for c in clusters if c["health"].startswith("online")), clusters  # not "-"
    table = (await asyncio.to_thread(mkctl, "clusters", "list", *server)).output
    assert "CPU FREE" in table and all(c["cpu_free"] in table for c in clusters if c["cpu_free"])
    shown = await asyncio.to_thread(api, "/workloads/default/pytorch-simple")
    assert {"MultiClusterDispatched"} <= {c["type"] for c in shown["conditions"]}, shown["conditions"]
    why = await asyncio.to_thread(api, "/why/default/too-large")
    assert why["answer"].startswith("can never run here: no node has 16 nvidia.com/gpu for a "), why
    assert "(largest node: 4) on worker-3" in why["answer"], why  # the GPU cluster, named first
    assert any("worker-3 (heartbeat" in d for d in why["details"]), why
    counted = (await asyncio.to_thread(api, "/handover/status"))["items"]
    assert {"kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"} <= {c["controller"] for c in counted}
    queues = await asyncio.to_thread(api, "/queues")
    assert {q["name"] for q in queues["cluster_queues"]} == {"team-a", "team-b", "shared"}

    # the metrics count what the API lists: Workloads per LocalQueue (namespace and name) and state
    def from_queues() -> str:
        page = api("/queues")
        return "\n".join(sorted(f"{q['namespace']}/{q['name']} {state} {n}" for q in page["local_queues"]
                                 for state, n in q["workloads"].items() if n))

    def from_metrics() -> str:
        text = httpx.get(f"{base}/metrics", timeout=30).text
        found = re.findall(r'^mkd_workloads\{namespace="([^"]+)",queue="([^"]+)",state="([^"]+)"\} ([0-9.]+)$',
                           text, re.M)
        return "\n".join(sorted(f"{ns}/{q} {state} {int(float(n))}" for ns, q, state, n in found if float(n)))

    await _agree("mkd_workloads against the API's queues", [from_queues, from_metrics])

    # the dashboard shows the same values
    cookies = {"mkd_token": token}
    async with httpx.AsyncClient(base_url=base, cookies=cookies, timeout=30) as ui:
        page = (await ui.get("/ui/workloads")).text
        for w in from_api:
            assert w["name"] in page
        page = (await ui.get("/ui/workloads/default/pytorch-simple")).text
        for c in shown["conditions"]:
            assert c["type"] in page and c["reason"] in page
        page = (await ui.get("/ui/workloads/default/too-large")).text
        assert "can never run here" in page and "worker-3 (heartbeat" in page
        page = (await ui.get("/ui/clusters")).text
        for c in clusters:
            assert c["name"] in page
        page = (await ui.get("/ui/queues")).text
        for q in queues["cluster_queues"]:
            assert q["name"] in page
        for lq in queues["local_queues"]:
            assert f"{lq['namespace']}/{lq['name']}" in page
    assert len(checked) == len(verbs)
