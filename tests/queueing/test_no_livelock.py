"""No eviction livelock, and every victim is one Kueue's order allows, over random streams.

Random streams of Jobs (1 or 2 cpu, random ClusterQueue and priority) go through the pure scheduler on
a virtual clock, with the running Job admitted first deleted now and then, on the cohort of three
ClusterQueues of ``streams.issue_objects`` (classical, with ``borrowWithinCohort``, and with fair
sharing). A Job is never evicted twice for the same preemptor unless something new happened in between
(a Job arrived or one finished): a preemptor's reclaimed room is its own, so what it evicted never comes
back to be evicted again for the same want (the livelock of a pending Job reclaiming, again and again,
room that a borrowing Job took back). Every victim of another ClusterQueue came from one above its nominal
quota at that moment (counting what the pass admitted before), and a victim in the preemptor's own ClusterQueue had a lower priority.
A preemptor is always of A: B and C have Kueue's default policy (``withinClusterQueue`` and
``reclaimWithinCohort`` Never, no ``borrowWithinCohort``), so nothing is ever evicted for a Workload of theirs,
whatever they admit. All of this with mkd's default order (Kueue's ``PrioritizePreemptorWorkloads`` gate on):
with the gate off Kueue itself loops (``test_kueue_streams.py``).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.queueing.streams import PRIORITIES, Job, Step, drive, issue_objects

NOMINAL = {"a": 4, "b": 2, "c": 2}


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Job], list[float]]:
    n = draw(st.integers(5, 30))
    jobs = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.5, 1.2, 3.0]))
        jobs.append(Job(f"j{i:02d}", draw(st.sampled_from(["qa", "qb", "qc"])), draw(st.sampled_from([1, 2])),
                        draw(st.sampled_from(list(PRIORITIES))), round(t, 3)))
    deletions = sorted({round(t + draw(st.floats(0.5, 40.0)), 1) for _ in range(draw(st.integers(0, n)))})
    return jobs, deletions


def check(steps: list[Step], jobs: list[Job]) -> None:
    by_name = {j.name: j for j in jobs}
    arrivals = sorted(j.at for j in jobs)
    usage = {"a": 0, "b": 0, "c": 0}
    cq_of: dict[str, str] = {}
    last_evicted: dict[tuple[str, str], float] = {}
    releases: list[float] = []
    t_prev = None
    start_usage = dict(usage)
    for s in steps:
        if s.at != t_prev:   # a pass decides on the usage it starts with and what it admits before preempting
            t_prev, start_usage = s.at, dict(usage)
            for o in steps:
                if o.at == s.at and o.what == "admit":
                    start_usage[o.cq] += by_name[o.job].cpu
        j = by_name[s.job]
        if s.what == "admit":
            cq_of[s.job] = s.cq
            usage[s.cq] += j.cpu
            continue
        usage[cq_of[s.job]] -= j.cpu
        if s.what == "delete":
            releases.append(s.at)
            continue
        before = last_evicted.get((s.job, s.preemptor))
        if before is not None:
            news = [t for t in arrivals + releases if before < t <= s.at]
            assert news, f"{s.job} evicted for {s.preemptor} at {before} and again at {s.at}, nothing new in between"
        last_evicted[(s.job, s.preemptor)] = s.at
        preemptor = by_name[s.preemptor]
        assert preemptor.queue == "qa", f"{s}: {s.preemptor}'s ClusterQueue never preempts"
        victim_cq = cq_of[s.job]
        if s.reason == "InClusterQueue":
            assert victim_cq == "a" and PRIORITIES[j.priority] < PRIORITIES[preemptor.priority], s
        else:
            assert victim_cq != "a", s
            assert start_usage[victim_cq] > NOMINAL[victim_cq], f"{s}: {victim_cq} was within its nominal quota"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(streams(), st.sampled_from(["classical", "borrowWithinCohort", "fair"]))
def test_no_job_is_evicted_twice_for_the_same_preemptor_and_victims_follow_kueues_order(
        stream: tuple[list[Job], list[float]], mode: str) -> None:
    jobs, deletions = stream
    fair = mode == "fair"
    trace = drive(issue_objects(fair=fair, borrow_within_cohort=mode == "borrowWithinCohort"), jobs, deletions,
                  fair=fair)
    check(trace.steps, jobs)
