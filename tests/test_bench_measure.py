"""The end-to-end benchmark's pure helpers (bench/e2e_measure.py): no process, no cluster, no timing."""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from bench.e2e_measure import collapsed_top, cpu_lines, pct, report_stamps, stage_table
from federation import messages, signing


def test_pct_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert pct(values, 0.5) == 50.0
    assert pct(values, 0.99) == 99.0
    assert pct(values, 1.0) == 100.0
    assert pct([3.0, 1.0, 2.0], 0.0) == 1.0
    assert pct([7.0], 0.99) == 7.0
    assert math.isnan(pct([], 0.5))


def test_stage_table_measures_from_created_and_from_the_stage_before() -> None:
    stages = (("created", "created"), ("placed", "placed"), ("never", "never recorded"), ("done", "done"))
    stamps = {
        "created": {"a": 100.0, "b": 100.0},
        "placed": {"a": 100.5, "b": 101.0},
        "done": {"a": 102.5},  # b never finished: counted in no percentile of this stage
    }
    head, created, placed, never, done = stage_table(stamps, stages)
    assert "since created p50" in head
    assert created.split()[1:3] == ["2", "0"]
    assert placed.split() == ["placed", "2", "500", "ms", "1000", "ms", "500", "ms", "1000", "ms"]
    assert never.split()[-5:] == ["0", "-", "-", "-", "-"]
    # the step skips a stage nobody reached and is measured from the last stage that has times
    assert done.split() == ["done", "1", "2500", "ms", "2500", "ms", "2000", "ms", "2000", "ms"]


def test_cpu_lines_per_job_and_the_federation_sum() -> None:
    used = {"dispatcher": 2.0, "agent-w1": 1.0, "kubesim-w1": 3.0}
    lines = cpu_lines(used, 1000, 10.0, federation=("dispatcher", "agent-w1"))
    assert lines[1].split() == ["kubesim-w1", "3.00", "3.00"]  # busiest first
    total = next(line for line in lines if line.split()[0] == "total")
    assert total.split()[1:3] == ["6.00", "6.00"]
    own = next(line for line in lines if line.strip().startswith("dispatcher + agents"))
    assert own.split()[3:5] == ["3.00", "3.00"]


def test_collapsed_top_counts_own_and_anywhere_samples(tmp_path: Path) -> None:
    raw = tmp_path / "spy.txt"
    raw.write_text("main (a.py:1);f (a.py:2);g (a.py:3) 5\n"
                   "main (a.py:1);g (a.py:3) 2\n"
                   "main (a.py:1);f (a.py:2) 4\n"
                   "garbage line\n", encoding="utf-8")
    top = collapsed_top(raw, top=2)
    assert top == [("g (a.py:3)", 7, 7), ("f (a.py:2)", 4, 9)]


def _sealed(report: messages.ReportBase, t_ms: int) -> bytes:
    sealer = signing.Sealer(signing.parse_private_key(signing.generate()[0]), now_ms=lambda: t_ms)
    return sealer.seal("mkd/v1/w1/reports", messages.encode(report), stream="s1", n=1)


def test_report_stamps_take_the_first_accepted_and_the_first_status_with_start_time() -> None:
    key = messages.PlacementKey(workload_uid="uid-a", attempt=1, epoch=1)
    accepted = messages.Accepted(cluster="w1", placement=key, spec_version=1, seq=1)
    pending = messages.Status(cluster="w1", placement=key, seq=2, status={"conditions": []})
    running = messages.Status(cluster="w1", placement=key, seq=3, status={"startTime": "2026-11-24T09:00:00Z"})
    into: dict[str, dict[str, float]] = {}
    for payload in (_sealed(accepted, 1_000), _sealed(pending, 2_000), _sealed(running, 3_000),
                    _sealed(accepted, 4_000), _sealed(running, 5_000), b"not json", b""):
        report_stamps(payload, into)
    assert into == {"accepted_sent": {"uid-a": 1.0}, "running_sent": {"uid-a": 3.0}}


def test_report_stamps_find_reports_carried_together_in_one_message() -> None:
    def report(uid: str) -> dict[str, object]:
        return {"type": "accepted", "placement": {"workload_uid": uid, "attempt": 1, "epoch": 1}}

    payload = (b'{"v":1,"type":"reports","reports":[' + b",".join(
        orjson.dumps(report(u)) for u in ("a", "b")) + b'],"seal":{"k":"0","s":"s","n":1,"t":7000,"sig":"x"}}')
    into: dict[str, dict[str, float]] = {}
    report_stamps(payload, into)
    assert into == {"accepted_sent": {"a": 7.0, "b": 7.0}}


def test_pair_table_compares_b_with_a_pair_by_pair_and_counts_where_b_was_better() -> None:
    from bench.e2e_measure import pair_table

    def run(rate: float, total: float, own: float, dispatcher: float, complete: bool = True) -> dict[str, object]:
        return {"e2e_rate": rate, "total_ms_per_job": total, "dispatcher_agents_ms_per_job": own,
                "cpu_ms_per_job": {"dispatcher": dispatcher}, "complete": complete}

    lines = pair_table([(run(100.0, 4.0, 2.0, 0.5), run(110.0, 3.6, 1.9, 0.5)),
                        (run(200.0, 2.0, 1.0, 0.4), run(190.0, 2.1, 0.9, 0.3, complete=False))])
    rates = [ln.split() for ln in lines if ln.strip().startswith("end to end")]
    assert rates[0][-1] == "+10.0%" and rates[1][-1] == "-5.0%"
    assert rates[2][-7:] == ["+2.5%", "(B", "better", "in", "1", "of", "2)"]  # higher is better for a rate
    cpu = [ln for ln in lines if "every process" in ln]
    assert cpu[-1].endswith("(B better in 1 of 2)")  # -10 % (better) and +5 % (worse)
    own = [ln for ln in lines if "dispatcher + agents" in ln]
    assert own[-1].endswith("(B better in 2 of 2)")
    assert not any("PostgreSQL" in ln for ln in lines)  # a figure no run has is left out
    assert lines[-1] == "  INCOMPLETE runs (jobs not seen Running on the manager in time): B in pair 2"
