"""The agent's remembered policy answers: the same as the check's, for every (namespace, spec), never a stale one."""

from __future__ import annotations

import copy

from tests.security.attacks import harmless_job, hostile_job
from worker_agent.policy import CheckedPolicy, Policy, PolicySettings


def test_remembered_answers_are_the_checks_own() -> None:
    settings = PolicySettings(allowed_namespaces=["team-a", "team-b"])
    plain, checked = Policy(settings), CheckedPolicy(settings)
    good, bad = harmless_job("fine"), hostile_job()
    edited = copy.deepcopy(good)  # once fine, then one field refused: the new spec is judged anew
    edited["spec"]["template"]["spec"]["hostNetwork"] = True
    renamed = copy.deepcopy(bad)
    renamed["metadata"]["name"] = "another-name"  # same spec, another Job: the same answer
    for manifest, ns in [(good, "team-a"), (bad, "team-a"), (good, "team-a"), (good, "team-c"), (edited, "team-a"),
                         (bad, "team-b"), (renamed, "team-a"), (good, "kube-system"), (edited, "team-a")]:
        assert checked.check(manifest, ns) == plain.check(manifest, ns)
    assert checked.check(good, "team-a") == []
    assert any(v.field.endswith("hostNetwork") for v in checked.check(edited, "team-a"))
