"""``POST /api/v1/whatif`` answers with ``mkctl whatif -o json``'s report; bad input is a 400 naming line and field."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from dispatcher import db
from dispatcher.api import create_app
from dispatcher.api.auth import Authenticator
from dispatcher.api.routes import ApiContext
from federation.kube import Kube
from tests.whatif.builders import QUEUE_TEXT, cluster, install_queues, job
from tests.whatif.test_cli import _fill

TOKEN = "whatif-token"
QUEUES = QUEUE_TEXT
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'mkd.db'}"
    await _fill(url)
    engine = db.make_engine(url)
    ctx = ApiContext(sessions=db.sessionmaker(engine), auth=Authenticator(static_token=TOKEN))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ctx)), base_url="http://api",
                                 timeout=60) as c:
        yield c
    await engine.dispose()


async def test_whatif_replays_the_history_with_the_live_clusters_and_compares(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/v1/whatif", json={})).status_code == 401
    queues = QUEUES
    got = await client.post("/api/v1/whatif", headers=AUTH, json={"configuration": queues})
    assert got.status_code == 200, got.text
    rep = got.json()
    assert rep["admitted"] == 3 and rep["clusters"]["w1"]["admissions"] == 3
    assert rep["sources"]["trace"] == "the dispatcher's history"
    more = next(d for d in yaml.safe_load_all(queues) if d["metadata"]["name"] == "team-a" and d["kind"] == "ClusterQueue")
    more["spec"]["stopPolicy"] = "Hold"
    got = await client.post("/api/v1/whatif", headers=AUTH,
                            json={"configuration": queues, "compare": yaml.safe_dump(more), "plot": True})
    assert got.status_code == 200, got.text
    both = got.json()
    assert both["a"]["clusterQueues"]["team-a"]["admitted"] == 2
    assert both["b"]["clusterQueues"]["team-a"]["admitted"] == 0   # held: team-a admits nothing new
    assert "ClusterQueue team-a is stopped" in both["b"]["neverRan"][0]["reason"]
    assert base64.b64decode(both["plot"])[:4] == b"\x89PNG"


async def test_whatif_takes_a_trace_and_names_the_bad_line(client: httpx.AsyncClient) -> None:
    queues = QUEUES + "---\n" + yaml.safe_dump(cluster("x", 1, "8"))
    lines = [job("a", "team-a", 0, 10, ("w", 1, "1")), job("b", "team-a", 1, 10, ("w", 1, "1"))]
    got = await client.post("/api/v1/whatif", headers=AUTH, json={"trace": "\n".join(lines), "configuration": queues})
    assert got.status_code == 200, got.text
    assert [c for c in got.json()["clusters"]] == ["x"]
    bad = [*lines, '{"name": "c", "namespace": "team-a", "arrival": 0, "runSeconds": 5, "podSets": [{"name": "w"}]}']
    got = await client.post("/api/v1/whatif", headers=AUTH, json={"trace": "\n".join(bad), "configuration": queues})
    assert got.status_code == 400
    assert "line 3: podSets[0].requests" in got.json()["detail"]
    got = await client.post("/api/v1/whatif", headers=AUTH, json={"since": "a while"})
    assert got.status_code == 400 and got.json()["detail"].startswith("since: 'a while' is neither")
    got = await client.post("/api/v1/whatif", headers=AUTH, json={})   # no manager to read the queues from
    assert got.status_code == 400 and "no ClusterQueue is given" in got.json()["detail"]


async def test_the_dashboard_compares_the_live_configuration_with_an_uploaded_change(tmp_path: Path,
                                                                                  kube: Kube) -> None:
    """The live queue objects are the manager's (kubesim, Kueue's CRDs); the clusters and history the database's."""
    await install_queues(kube)
    docs = list(yaml.safe_load_all(QUEUES))
    url = f"sqlite+aiosqlite:///{tmp_path / 'mkd.db'}"
    await _fill(url)
    engine = db.make_engine(url)
    ctx = ApiContext(sessions=db.sessionmaker(engine), auth=Authenticator(static_token=TOKEN), kube=kube)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ctx)), base_url="http://api",
                                 timeout=60, cookies={"mkd_token": TOKEN}) as c:
        page = await c.get("/ui/whatif")
        assert page.status_code == 200 and "id='whatif-form'" in page.text and ">What if</a>" in page.text
        held = next(d for d in docs if d["kind"] == "ClusterQueue" and d["metadata"]["name"] == "team-a")
        held["spec"]["stopPolicy"] = "Hold"
        got = await c.post("/ui/whatif", data={"compare": yaml.safe_dump(held), "since": "3650d"})
        assert got.status_code == 200
        assert "id='comparison'" in got.text and "data:image/png;base64," in got.text
        assert "2 → 0, preempted 0 → 0" in got.text   # team-a: held, it admits nothing
        bad = await c.post("/ui/whatif", data={"compare": "kind: Gadget\n", "since": "3650d"})
        assert "id='error'" in bad.text, bad.text[-2000:]
        assert "Gadget" in bad.text.split("id='error'")[1].split("</p>")[0], bad.text[-2000:]
    await engine.dispose()
