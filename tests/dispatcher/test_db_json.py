"""The JSON columns go through orjson (dispatcher.db.json_dumps / json_loads): what is stored reads back
equal to what the stdlib's json wrote before, on SQLite and PostgreSQL, and rows written the old way
still read the same."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from dispatcher import db
from dispatcher.db.models import workloads
from dispatcher.db.queries import events as event_q
from dispatcher.db.queries import placements as placement_q
from dispatcher.db.queries import sql
from dispatcher.db.queries import workloads as workload_q

VALUES: dict[str, Any] = {
    "labels": {"team": "Zürich ☃", "app": "trainer"},
    "requests": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"},
    "podsets": [{"name": "master", "count": 1, "requests": {"cpu": "1"}, "nodeSelector": {"zone": "a"},
                 "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]}],
    "excluded": ["worker-2"],
    "flavors": {"master": {"cpu": "default"}},
    "usage": {"default/cpu": "2", "big": 2**70},
}


def row(uid: str, now: datetime) -> dict[str, Any]:
    return {"uid": uid, "namespace": "default", "name": uid, "kind": "PyTorchJob", "api_version": "kubeflow.org/v1",
            "queue": "default", "priority": 0, "state": "pending", "reason": "", "spec_version": 1, "generation": 1,
            "suspended": False, "requests": VALUES["requests"], "podsets": VALUES["podsets"], "attempt": 0,
            "cluster": None, "excluded": VALUES["excluded"], "created_at": now, "updated_at": now,
            "labels": VALUES["labels"], "queued_at": now, "queue_seq": 1, "priority_source": ""}


def test_serializer_writes_what_json_reads_back_equal() -> None:
    for value in VALUES.values():
        text = db.json_dumps(value)
        assert json.loads(text) == value
        assert db.json_loads(text) == value
        assert db.json_loads(json.dumps(value)) == value
    assert db.json_dumps({1: "a"}) == json.dumps({1: "a"}).replace(" ", "")  # non-string keys as json does
    assert db.json_loads('{"a": NaN}')["a"] != 0  # what only the stdlib reads still reads


async def test_json_columns_round_trip(db_url: str) -> None:
    engine = db.make_engine(db_url)
    sessions = db.sessionmaker(engine)
    now = datetime.now(UTC)
    try:
        async with sessions.begin() as s:
            assert await workload_q.claim(s, [row("u1", now)]) == {"u1"}
            await workload_q.update_workloads(s, [{"b_uid": "u1", "flavors": VALUES["flavors"], "usage": VALUES["usage"]}])
            # a row written by an older dispatcher through the stdlib's json (spaces, escaped non-ASCII)
            await s.execute(sa.text("INSERT INTO workloads (uid, namespace, name, kind, api_version, queue, state, "
                                    "requests, podsets, excluded, created_at, updated_at, labels) VALUES ('u2', "
                                    "'default', 'u2', 'PyTorchJob', 'kubeflow.org/v1', 'default', 'pending', "
                                    ":requests, :podsets, :excluded, :now, :now, :labels)")
                            .bindparams(sa.bindparam("now", type_=workloads.c.created_at.type)),
                            {"requests": json.dumps(VALUES["requests"]), "podsets": json.dumps(VALUES["podsets"]),
                             "excluded": json.dumps(VALUES["excluded"]), "labels": json.dumps(VALUES["labels"]),
                             "now": now})
        async with sessions() as s:
            got = {r.uid: r for r in (await s.execute(sa.select(workloads))).all()}
            for uid in ("u1", "u2"):
                for col in ("labels", "requests", "podsets", "excluded"):
                    assert getattr(got[uid], col) == VALUES[col], (uid, col)
            assert got["u1"].flavors == VALUES["flavors"] and got["u1"].usage == VALUES["usage"]
            assert (await workload_q.load_podsets(s, ["u1", "u2"])) == {"u1": VALUES["podsets"], "u2": VALUES["podsets"]}
    finally:
        await engine.dispose()


async def test_rows_as_one_json_text_store_what_sqlalchemy_stores(db_url: str, monkeypatch: Any) -> None:
    """On PostgreSQL a batch's inserts and updates travel as one JSON text (``json_to_recordset``), not as
    SQLAlchemy's executemany: the rows stored are the same, to the JSON text of each column, a JSON None
    stored as JSON ``null`` (as SQLAlchemy's JSON type does) and the datetimes' instants kept."""
    from dispatcher.db.models import events, placements

    engine = db.make_engine(db_url)
    sessions = db.sessionmaker(engine)
    now = datetime.now(UTC)
    stored: dict[str, list[tuple[Any, ...]]] = {}
    try:
        for way in ("json", "executemany"):
            if way == "executemany":
                monkeypatch.setattr(sql, "rows_json", lambda rows: None)  # SQLAlchemy's path, as on SQLite
            uids = [f"{way}-{i}" for i in range(3)]
            async with sessions.begin() as s:
                assert await workload_q.claim(s, [row(u, now) for u in uids]) == set(uids)
                await workload_q.update_workloads(s, [{"b_uid": u, "flavors": None if i else VALUES["flavors"],
                                              "usage": {"default/cpu": "2"}, "suspended": True, "reason": "Zürich ☃",
                                              "reserved_at": now} for i, u in enumerate(uids)])
                await placement_q.add_placements(s, [{"workload_uid": u, "attempt": 1, "cluster": "worker-1", "epoch": 7,
                                            "state": "sent", "spec_version": 1, "created_at": now, "reason": "fits"}
                                           for u in uids])
                await placement_q.update_placements(s, [{"b_uid": u, "b_attempt": 1, "state": "accepted", "accepted_at": now,
                                               "last_status_seq": 2**60} for u in uids])
                await event_q.add_events(s, [{"workload_uid": u, "at": now, "type": "accepted", "cluster": "worker-1",
                                        "message": "attempt 1 accepted"} for u in uids] + [
                                   {"at": now, "type": "cluster_online", "cluster": "worker-1"}])
            async with sessions() as s:
                text = [sa.cast(c, sa.Text) if isinstance(c.type, sa.JSON) else c
                        for c in workloads.c if c.name not in ("uid", "name")]
                stored[way] = [tuple(r) for r in (await s.execute(
                    sa.select(*text).where(workloads.c.uid.in_(uids)).order_by(workloads.c.uid))).all()]
                stored[way] += [tuple(r) for r in (await s.execute(
                    sa.select(*[c for c in placements.c if c.name not in ("id", "workload_uid")])
                    .where(placements.c.workload_uid.in_(uids)).order_by(placements.c.workload_uid))).all()]
                stored[way] += [tuple(r) for r in (await s.execute(
                    sa.select(*[c for c in events.c if c.name not in ("id", "workload_uid")])
                    .where(sa.or_(events.c.workload_uid.in_(uids), events.c.type == "cluster_online"))
                    .order_by(events.c.id))).all()][-4:]
        assert stored["json"] == stored["executemany"]
        assert ("null",) == tuple(r for r in stored["json"][1] if r == "null")  # flavors: JSON null, not NULL
    finally:
        await engine.dispose()
