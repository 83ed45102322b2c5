"""The parts of deploy/ and of the HandoverPolicy CRD that list job kinds, generated from the kind registry.

Each generated part sits between two comment lines in its file, ``# BEGIN generated: <block> (mkctl kinds
--update)`` and ``# END generated: <block>``; :func:`render` writes every block from
:data:`~federation.kinds.registry.KINDS` (the dispatcher's, the agent's and the fencer's RBAC for the kinds, the handover
webhook's rules, the managedBy-immutable admission policies, the HandoverPolicy kinds enum) and the list of CRD files
in ``federation/kinds/crds/Kustomization`` from that folder, and
:func:`stale` names the files whose blocks differ from what the registry says. Nothing here talks to a
cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from federation.kinds.base import JobKind

BUILTIN_GROUPS = frozenset({"", "batch", "apps"})
"""API groups served by the API server itself: webhooks and policies match their one version, CRDs every one."""
WIDTH = 112
"""Wrap flow lists at this column (the repository's line length)."""


def _flow(items: Iterable[str], indent: int) -> str:
    """A YAML flow sequence of strings, wrapped under its first item when longer than :data:`WIDTH`."""
    parts = [json.dumps(i) for i in items]
    lines: list[str] = []
    line = "["
    for i, part in enumerate(parts):
        piece = part + ("," if i < len(parts) - 1 else "]")
        if len(line) > 1 and indent + len(line) + 1 + len(piece) > WIDTH:
            lines.append(line)
            line = " " + piece  # continuation lines start one past the opening bracket
        else:
            line = f"{line} {piece}" if len(line) > 1 else line + piece
    lines.append(line)
    if not parts:
        return "[]"
    return ("\n" + " " * indent).join(lines)


def _groups(kinds: Sequence[JobKind]) -> dict[str, list[JobKind]]:
    """Kinds by API group, groups in registry order."""
    out: dict[str, list[JobKind]] = {}
    for kind in kinds:
        out.setdefault(kind.group, []).append(kind)
    return out


def _rule(lines: list[str], group: str, resources: Sequence[str], verbs: Sequence[str]) -> None:
    lines.append(f"- apiGroups: {_flow([group], 13)}")
    lines.append(f"  resources: {_flow(resources, 13)}")
    lines.append(f"  verbs: {_flow(verbs, 9)}")


def _reads(kinds: Sequence[JobKind]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for kind in kinds:
        for group, plural in kind.reads:
            if plural not in out.setdefault(group, []):
                out[group].append(plural)
    return out


def dispatcher_rules(kinds: Sequence[JobKind]) -> list[str]:
    lines = ["# Intake: list/watch every supported kind (get: a Job whose claim is in doubt is read once)."]
    for group, members in _groups(kinds).items():
        _rule(lines, group, [k.plural for k in members], ["get", "list", "watch"])
    lines.append("# The status mirror and mkd's conditions: merge patches of the status subresource.")
    for group, members in _groups(kinds).items():
        _rule(lines, group, [f"{k.plural}/status" for k in members], ["patch"])
    reads = _reads(kinds)
    if reads:
        lines.append("# What a kind's PodSets are computed from (a TrainJob's runtime), read when it is claimed.")
        for group, plurals in reads.items():
            _rule(lines, group, plurals, ["get"])
    return lines


def agent_read_rules(kinds: Sequence[JobKind]) -> list[str]:
    lines = ["# The agent watches its own Jobs everywhere."]
    for group, members in _groups(kinds).items():
        _rule(lines, group, [k.plural for k in members], ["get", "list", "watch"])
    reads = _reads(kinds)
    if reads:
        lines.append("# What a kind's render reads (a TrainJob's runtime).")
        for group, plurals in reads.items():
            _rule(lines, group, plurals, ["get"])
    return lines


def agent_write_rules(kinds: Sequence[JobKind]) -> list[str]:
    lines = ["# It creates, replaces (compare-and-set on resourceVersion) and deletes; it patches only to suspend",
             "# and resume its Jobs when its lease runs out and comes back (fencing, worker_agent/lease.py)."]
    for group, members in _groups(kinds).items():
        _rule(lines, group, [k.plural for k in members], ["create", "update", "patch", "delete"])
        _rule(lines, group, [f"{k.plural}/status" for k in members], ["update"])
    return lines


def _versions(group: str, members: Sequence[JobKind]) -> list[str]:
    return sorted({k.version for k in members}) if group in BUILTIN_GROUPS else ["*"]


def fencer_read_rules(kinds: Sequence[JobKind]) -> list[str]:
    lines = ["# The fencer lists the placed Jobs of every kind."]
    for group, members in _groups(kinds).items():
        _rule(lines, group, [k.plural for k in members], ["list"])
    return lines


def fencer_write_rules(kinds: Sequence[JobKind]) -> list[str]:
    lines = ["# It suspends them with a merge patch."]
    for group, members in _groups(kinds).items():
        _rule(lines, group, [k.plural for k in members], ["patch"])
    return lines


def handed_over(kinds: Sequence[JobKind]) -> list[JobKind]:
    """The kinds with a managedBy field: the ones a HandoverPolicy can hand to mkd and whose managedBy the
    admission policies keep (a kind without one, LeaderWorkerSet, is handed over by its queue label)."""
    return [k for k in kinds if k.managed_by_path]


def webhook_rules(kinds: Sequence[JobKind]) -> list[str]:
    lines: list[str] = []
    for group, members in _groups(handed_over(kinds)).items():
        lines.append('- operations: ["CREATE"]')
        lines.append(f"  apiGroups: {_flow([group], 13)}")
        lines.append(f"  apiVersions: {_flow(_versions(group, members), 15)}")
        lines.append(f"  resources: {_flow([k.plural for k in members], 13)}")
    return lines


def _policy_name(path: Sequence[str]) -> str:
    return f"mkd-managedby-immutable-{path[-2].lower()}"


def _cel_value(obj: str, path: Sequence[str]) -> list[str]:
    """The value at ``path`` of ``obj``, "" when unset (a folded scalar: the two lines read as one)."""
    tests = [f"has({obj}.{'.'.join(path[:n])})" for n in range(2, len(path) + 1)]
    return [" && ".join(tests), f"? {obj}.{'.'.join(path)} : \"\""]


def admission_policies(kinds: Sequence[JobKind]) -> list[str]:
    by_path: dict[tuple[str, ...], list[JobKind]] = {}
    for kind in handed_over(kinds):
        by_path.setdefault(tuple(kind.managed_by_path), []).append(kind)
    lines: list[str] = []
    for path, members in by_path.items():
        name, dotted = _policy_name(path), ".".join(path)
        if lines:
            lines.append("---")
        lines += ["apiVersion: admissionregistration.k8s.io/v1", "kind: ValidatingAdmissionPolicy",
                  "metadata:", f"  name: {name}", "spec:", "  failurePolicy: Fail", "  matchConstraints:",
                  "    resourceRules:"]
        for group, group_members in _groups(members).items():
            lines.append(f"      - apiGroups: {_flow([group], 19)}")
            lines.append(f"        apiVersions: {_flow(_versions(group, group_members), 21)}")
            lines.append('        operations: ["UPDATE"]')
            lines.append(f"        resources: {_flow([k.plural for k in group_members], 19)}")
        lines += ["  variables:", "    - name: old", "      expression: >-",
                  *(f"        {line}" for line in _cel_value("oldObject", path)),
                  "    - name: new", "      expression: >-",
                  *(f"        {line}" for line in _cel_value("object", path)), "  validations:",
                  '    - expression: "variables.old == variables.new"', "      messageExpression: >-",
                  f"        \"{dotted} is immutable (was '\" + variables.old + \"', now '\" + variables.new +",
                  "        \"'); delete and re-create the job to hand it to another controller\"",
                  "      reason: Invalid", "---", "apiVersion: admissionregistration.k8s.io/v1",
                  "kind: ValidatingAdmissionPolicyBinding", "metadata:", f"  name: {name}", "spec:",
                  f"  policyName: {name}", '  validationActions: ["Deny"]']
    return lines


def kinds_enum(kinds: Sequence[JobKind]) -> list[str]:
    return [f"enum: {_flow([k.name for k in handed_over(kinds)], 6)}".replace('"', "")]


CRDS_DIR = Path(__file__).resolve().parent / "crds"


def crd_files(kinds: Sequence[JobKind]) -> list[str]:
    """The CRD files shipped in ``federation/kinds/crds`` (a kind's CRD is a file there; Kueue's are too)."""
    return [f"- {path.name}" for path in sorted(CRDS_DIR.glob("*.yaml"))]


@dataclass(frozen=True)
class Block:
    path: str
    """Relative to the repository root."""
    name: str
    render: Callable[[Sequence[JobKind]], list[str]]


BLOCKS = (
    Block("deploy/manager/dispatcher.yaml", "dispatcher-kinds", dispatcher_rules),
    Block("deploy/worker/agent.yaml", "agent-kinds-read", agent_read_rules),
    Block("deploy/worker/agent.yaml", "agent-kinds-write", agent_write_rules),
    Block("deploy/worker/fencer.yaml", "fencer-kinds-read", fencer_read_rules),
    Block("deploy/worker/fencer.yaml", "fencer-kinds-write", fencer_write_rules),
    Block("deploy/components/handover-webhook/webhook.yaml", "webhook-kinds", webhook_rules),
    Block("deploy/admission/managedby-immutable.yaml", "managedby-immutable", admission_policies),
    Block("dispatcher/handover/crds/handoverpolicies.handover.mkd.dev.yaml", "handover-kinds", kinds_enum),
    Block("federation/kinds/crds/Kustomization", "crd-files", crd_files),
)


def markers(name: str) -> tuple[str, str]:
    return f"# BEGIN generated: {name} (mkctl kinds --update)", f"# END generated: {name}"


def _replace(text: str, block: Block, kinds: Sequence[JobKind]) -> str:
    begin, end = markers(block.name)
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == begin]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(f"{block.path}: expected one {begin!r} line followed by one {end!r} line")
    first = lines[starts[0]]
    indent = first[: len(first) - len(first.lstrip())]
    body = [f"{indent}{line}" if line else line for part in block.render(kinds) for line in part.split("\n")]
    return "\n".join([*lines[: starts[0] + 1], *body, *lines[ends[0]:]])


def render(root: Path, kinds: Sequence[JobKind]) -> dict[str, str]:
    """Every file with generated blocks, as it should read (path relative to ``root`` -> text)."""
    out: dict[str, str] = {}
    for block in BLOCKS:
        text = out.get(block.path)
        if text is None:
            text = (root / block.path).read_text(encoding="utf-8")
        out[block.path] = _replace(text, block, kinds)
    return out


def stale(root: Path, kinds: Sequence[JobKind]) -> list[str]:
    """The files under ``root`` whose generated blocks differ from what ``kinds`` says."""
    return [path for path, text in render(root, kinds).items()
            if (root / path).read_text(encoding="utf-8") != text]


def update(root: Path, kinds: Sequence[JobKind]) -> list[str]:
    """Rewrite the stale files under ``root``; returns their paths."""
    changed = stale(root, kinds)
    rendered = render(root, kinds)
    for path in changed:
        (root / path).write_text(rendered[path], encoding="utf-8")
    return changed


# --- declared kinds: the same rules, as manifests of their own --------------------------------------

DECLARED = "declared-kinds"
"""In the names of the roles and bindings :func:`declared_manifests` writes (``mkd-agent-declared-kinds``), beside
deploy/'s, never over them."""


def _role(name: str, rules: list[str]) -> list[str]:
    return ["apiVersion: rbac.authorization.k8s.io/v1", "kind: ClusterRole", "metadata:", f"  name: {name}",
            "rules:", *(f"  {line}" for line in rules)]


def _binding(kind: str, name: str, role: str, account: str, namespace: str | None = None) -> list[str]:
    meta = ["metadata:", f"  name: {name}", *([f"  namespace: {namespace}"] if namespace else [])]
    return ["apiVersion: rbac.authorization.k8s.io/v1", f"kind: {kind}", *meta, "roleRef:",
            "  apiGroup: rbac.authorization.k8s.io", "  kind: ClusterRole", f"  name: {role}", "subjects:",
            "  - kind: ServiceAccount", f"    name: {account}", "    namespace: mkd-system"]


def declared_manifests(kinds: Sequence[JobKind], job_namespaces: Sequence[str]) -> dict[str, str]:
    """What deploy/ grants and enforces for mkd's kinds, for ``kinds`` (declared ones), as three YAML streams:
    ``manager`` (the dispatcher's ClusterRole and binding; apply in the manager cluster), ``worker`` (the
    agent's and the fencer's, its writes bound in each of ``job_namespaces`` as deploy/worker binds
    mkd-agent-workloads; apply in every worker cluster) and ``admission`` (managedBy immutable; apply where
    deploy/admission is)."""
    p = DECLARED
    manager = [*_role(f"mkd-dispatcher-{p}", dispatcher_rules(kinds)), "---",
               *_binding("ClusterRoleBinding", f"mkd-dispatcher-{p}", f"mkd-dispatcher-{p}", "mkd-dispatcher")]
    worker = [*_role(f"mkd-agent-{p}", agent_read_rules(kinds)), "---",
              *_binding("ClusterRoleBinding", f"mkd-agent-{p}", f"mkd-agent-{p}", "mkd-agent"), "---",
              *_role(f"mkd-agent-{p}-workloads", agent_write_rules(kinds))]
    for namespace in job_namespaces:
        worker += ["---", *_binding("RoleBinding", f"mkd-agent-{p}-workloads", f"mkd-agent-{p}-workloads",
                                    "mkd-agent", namespace)]
    worker += ["---", *_role(f"mkd-fencer-{p}", [*fencer_read_rules(kinds), *fencer_write_rules(kinds)]), "---",
               *_binding("ClusterRoleBinding", f"mkd-fencer-{p}", f"mkd-fencer-{p}", "mkd-fencer")]
    admission = [line.replace("ame: mkd-managedby-immutable-", "ame: mkd-managedby-immutable-declared-")
                 for line in admission_policies(kinds)]  # (n)ame and policyN(ame)
    return {"manager": "\n".join(manager) + "\n", "worker": "\n".join(worker) + "\n",
            "admission": "\n".join(admission) + "\n" if admission else ""}
