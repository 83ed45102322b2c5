"""The bulk statements touch only the rows they name (PostgreSQL).

Each batch of the engine updates its Workloads and placements in one statement over a JSON text or
arrays (``dispatcher.db.queries``). PostgreSQL cannot see how many rows such a parameter holds and plans
for 100 or more, so without a predicate it can look up in an index it joined them by hashing the whole
table: every Report batch read every placement ever made (at N = 10,000 jobs, 144 rows read per job
placed, bench/RESULTS.md), a cost that grows with the table. Read from the
server's own counters: the sequential scans of each table while one statement of a few rows runs
against thousands.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import db
from dispatcher.db.queries import placements as placement_q
from dispatcher.db.queries import workloads as workload_q

ROWS = 5_000


async def _seq_scans(session: AsyncSession, table: str) -> int:
    """Sequential scans of ``table`` so far, as the server counts them (this backend's counts flushed)."""
    await session.execute(sa.text("SELECT pg_stat_force_next_flush()"))
    await session.commit()
    await session.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
    found = (await session.execute(sa.text("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = :t"),
                                   {"t": table})).scalar_one()
    return int(found)


async def test_bulk_updates_look_their_rows_up_by_index_whatever_the_table_holds(db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's plans: SQLite updates row by row (executemany)")
    engine = db.make_engine(db_url)
    sessions = db.sessionmaker(engine)
    now = datetime.now(UTC)
    try:
        async with sessions.begin() as s:
            await s.execute(sa.text(
                "INSERT INTO workloads (uid, namespace, name, kind, api_version, queue, state, requests, podsets, "
                "excluded, created_at, updated_at) SELECT 'u' || i, 'ns', 'n' || i, 'PyTorchJob', "
                "'kubeflow.org/v1', 'q', CASE WHEN i <= 10 THEN 'pending' ELSE 'placed' END, '{}', '[]', '[]', "
                "now(), now() FROM generate_series(1, :n) AS i"), {"n": ROWS})
            await s.execute(sa.text(
                "INSERT INTO placements (workload_uid, attempt, cluster, epoch, state, reason, spec_version, "
                "last_status_seq, created_at) SELECT 'u' || i, 1, 'w1', 1, 'sent', '', 1, 0, now() "
                "FROM generate_series(11, :n) AS i"), {"n": ROWS})
        async with sessions() as s:
            await s.execute(sa.text("ANALYZE workloads"))
            await s.execute(sa.text("ANALYZE placements"))
            await s.commit()
            few = [f"u{i}" for i in range(100, 112)]
            statements = {
                "placements": lambda: placement_q.update_placements(s, [
                    {"b_uid": u, "b_attempt": 1, "state": "accepted", "accepted_at": now} for u in few]),
                "workloads": lambda: workload_q.update_workloads(s, [
                    {"b_uid": u, "state": "running", "reason": "", "updated_at": now} for u in few]),
            }
            for table, run in statements.items():
                before = await _seq_scans(s, table)
                await run()
                assert await _seq_scans(s, table) == before, f"a bulk update of 12 rows scanned all {table}"
            before = await _seq_scans(s, "workloads")
            won = await workload_q.mark_placed(s, {"w1": [f"u{i}" for i in range(1, 11)]}, now,
                                      {f"u{i}": {"cluster_queue": "cq", "flavors": {}, "usage": {}} for i in range(1, 11)})
            assert set(won) == {f"u{i}" for i in range(1, 11)}
            assert await _seq_scans(s, "workloads") == before, "mark_placed of 10 Workloads scanned all workloads"
            got = (await s.execute(sa.text("SELECT count(*) FROM placements WHERE state = 'accepted'"))).scalar_one()
            assert got == len(few)
    finally:
        await engine.dispose()
