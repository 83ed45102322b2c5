"""The import boundaries, checked by reading every module's imports (including ones inside functions).

* ``kubernetes`` only in federation/kube.py; ``aiomqtt`` / ``paho`` only in federation/mqtt.py;
  ``amqtt`` only in federation/embedded_broker.py (kubesim's own tests, test helpers and benchmark may drive it
  with the official client directly, to prove the emulator speaks its dialect);
* the dispatcher and the agent never import each other; federation imports neither;
* production code (dispatcher, worker_agent, federation) never imports kubesim — tests, bench and
  mkctl's demo may;
* inside the dispatcher, each module imports only its own room and the layers below (``DISPATCHER_LAYERS``).
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".venv", ".git", "build", "dist", "state", "node_modules", "__pycache__"}

ONLY_IN = {
    "kubernetes": {"federation/kube.py"},
    "aiomqtt": {"federation/mqtt.py"},
    "paho": {"federation/mqtt.py"},
    "amqtt": {"federation/embedded_broker.py"},
}
# kubesim/builtin_fields.py reads the client's generated models as the field sets of built-in kinds;
# tests/e2e/test_deploy_manifests.py applies an operator's rendered manifests of any kind with server-side
# dry-run, as kubectl would (the DynamicClient), which is no mkd code path.
ONLY_IN_EXEMPT_DIRS = {"kubernetes": ("tests/kubesim/", "bench/kubesim", "kubesim/testing.py",
                                      "kubesim/builtin_fields.py", "tests/e2e/test_deploy_manifests.py")}
FORBIDDEN = {  # package directory -> top-level modules it must not import
    "dispatcher": {"worker_agent", "kubesim"},
    "worker_agent": {"dispatcher", "kubesim"},
    "federation": {"dispatcher", "worker_agent", "kubesim", "mkctl"},
}


def python_files() -> Iterator[Path]:
    for directory, subdirs, files in os.walk(ROOT):
        # prune in place so the walk never descends into the virtualenv or build output
        subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name.endswith(".py"):
                yield Path(directory, name)


@functools.cache
def imported_modules(path: Path) -> tuple[tuple[str, int], ...]:
    """Absolute module names imported by ``path`` (relative imports stay inside their package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
    return tuple(found)


def violations() -> list[str]:
    found = []
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        package = rel.split("/")[0]
        for module, line in imported_modules(path):
            top = module.split(".")[0]
            allowed = ONLY_IN.get(top)
            if allowed is not None and rel not in allowed and not rel.startswith(ONLY_IN_EXEMPT_DIRS.get(top, ())):
                found.append(f"{rel}:{line} imports {module}; only {', '.join(sorted(allowed))} may")
            if top in FORBIDDEN.get(package, set()):
                found.append(f"{rel}:{line} imports {module}; {package} must not import {top}")
    return found


def test_import_boundaries_hold() -> None:
    assert violations() == []


def test_the_scanner_sees_the_boundary_modules() -> None:
    """Guards the guard: the scan reaches the files that are allowed the imports."""
    imports = {p.relative_to(ROOT).as_posix(): {m.split(".")[0] for m, _ in imported_modules(p)}
               for p in python_files()}
    assert "kubernetes" in imports["federation/kube.py"]
    assert "aiomqtt" in imports["federation/mqtt.py"]
    assert "amqtt" in imports["federation/embedded_broker.py"]
    assert "tests/federation/test_boundaries.py" in imports


@pytest.mark.parametrize(("source", "rel", "expected"), [
    ("import kubernetes.client\n", "dispatcher/x.py", "only federation/kube.py may"),
    ("def f():\n    from aiomqtt import Client\n", "worker_agent/y.py", "only federation/mqtt.py may"),
    ("from worker_agent.app import run\n", "dispatcher/z.py", "dispatcher must not import worker_agent"),
    ("import kubesim\n", "federation/w.py", "federation must not import kubesim"),
])
def test_a_violation_is_reported(source: str, rel: str, expected: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / rel
    target.parent.mkdir(parents=True)
    target.write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert any(expected in v for v in violations())


# The dispatcher's layers, lowest first. A room is a module or a package (the longest name that prefixes a
# module is its room). A module may import its own room and the rooms of lower layers, never a room of its
# own layer (those are independent) nor one above. A new module belongs to a room here before it lands.
DISPATCHER_LAYERS: tuple[tuple[str, ...], ...] = (
    ("dispatcher.intake.podgroups",),
    ("dispatcher.states", "dispatcher.settings", "dispatcher.placement", "dispatcher.intake.jobcache",
     "dispatcher.intake.unclaimed", "dispatcher.wire.freshrows", "dispatcher.wire.streams",
     "dispatcher.handover.safety", "dispatcher.wire.podstreams"),
    ("dispatcher.db", "dispatcher.workload", "dispatcher.admissioncheck.kueueview"),
    ("dispatcher.mirror.podstatus",),
    ("dispatcher.queueing", "dispatcher.mirror.conditions", "dispatcher.mirror.kubewriter",
     "dispatcher.clusters.identity", "dispatcher.clusters.policycheck", "dispatcher.replica",
     "dispatcher.wire.outbox"),
    ("dispatcher.engine.batch", "dispatcher.handover.policy", "dispatcher.whatif"),
    ("dispatcher.engine.transitions",),
    ("dispatcher.engine.core", "dispatcher.mirror.jobevents", "dispatcher.handover.book",
     "dispatcher.handover.webhook"),
    # the engine's parts: each decides one kind of inbox item, none imports another
    ("dispatcher.engine.jobchanges", "dispatcher.engine.answers", "dispatcher.engine.rounds",
     "dispatcher.engine.adminactions", "dispatcher.engine.heal", "dispatcher.engine.faults",
     "dispatcher.clusters.health", "dispatcher.handover.queries"),
    ("dispatcher.engine.loop",),
    ("dispatcher.intake.watch", "dispatcher.clusters.leases", "dispatcher.readmodel",
     "dispatcher.wire.workercauses", "dispatcher.admissioncheck.controller"),
    ("dispatcher.wire.reports", "dispatcher.api"),
    ("dispatcher.handover.service",),
    ("dispatcher.app",),
)


def dispatcher_modules(root: Path) -> dict[str, Path]:
    """Every module of the dispatcher by name; a package's ``__init__`` only when it imports the dispatcher."""
    found = {}
    for path in sorted((root / "dispatcher").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            if not any(m.split(".")[0] == "dispatcher" for m, _ in imported_modules(path)):
                continue
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def dispatcher_imports(path: Path, modules: set[str], packages: set[str]) -> list[tuple[str, int]]:
    """The dispatcher modules ``path`` imports (``from dispatcher.engine import core`` is engine.core)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "dispatcher")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "dispatcher":
            subs = [f"{node.module}.{a.name}" for a in node.names]
            named = [m for m in subs if m in modules or m in packages]
            found.extend((m, node.lineno) for m in named)
            if len(named) < len(subs):
                found.append((node.module, node.lineno))
    return found


def room_of(module: str) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for level, rooms in enumerate(DISPATCHER_LAYERS):
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and (best is None or len(room) > len(best[1])):
                best = (level, room)
    return best


def layer_violations(root: Path) -> list[str]:
    modules = dispatcher_modules(root)
    packages = {".".join(p.relative_to(root).parts) for p in (root / "dispatcher").rglob("*") if p.is_dir()}
    found = []
    for module, path in modules.items():
        mine = room_of(module)
        if mine is None:
            found.append(f"{module} belongs to no room: add it to DISPATCHER_LAYERS")
            continue
        rel = path.relative_to(root).as_posix()
        for target, line in dispatcher_imports(path, set(modules), packages):
            theirs = room_of(target)
            if theirs is None or theirs[1] == mine[1] or target in ("dispatcher", mine[1]):
                continue
            if theirs[0] >= mine[0]:
                where = "its own layer" if theirs[0] == mine[0] else "a higher layer"
                found.append(f"{rel}:{line} imports {target}, a room of {where} ({mine[1]} may import only "
                             "rooms below it)")
    return found


def test_the_dispatcher_imports_only_downwards() -> None:
    assert layer_violations(ROOT) == []


def test_every_room_of_the_layers_exists() -> None:
    """Guards the guard: a room renamed or removed leaves no stale name in the layers."""
    modules = dispatcher_modules(ROOT)
    packages = {".".join(p.relative_to(ROOT).parts) for p in (ROOT / "dispatcher").rglob("*") if p.is_dir()}
    for rooms in DISPATCHER_LAYERS:
        for room in rooms:
            assert room in modules or room in packages, room


@pytest.mark.parametrize(("rel", "source", "expected"), [
    ("dispatcher/engine/core.py", "from dispatcher.engine.loop import Engine\n",
     "imports dispatcher.engine.loop, a room of a higher layer"),
    ("dispatcher/engine/answers.py", "def f():\n    from dispatcher.engine import rounds\n",
     "imports dispatcher.engine.rounds, a room of its own layer"),
    ("dispatcher/newroom.py", "import dispatcher.states\n", "dispatcher.newroom belongs to no room"),
])
def test_a_layer_violation_is_reported(rel: str, source: str, expected: str, tmp_path: Path) -> None:
    for name in ("engine/loop.py", "engine/rounds.py", "states.py"):
        (tmp_path / "dispatcher" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "dispatcher" / name).write_text("")
    (tmp_path / rel).write_text(source)
    found = layer_violations(tmp_path)
    assert any(expected in v for v in found), found
    assert not any("engine/rounds.py" in v or "engine/loop.py" in v for v in found)


WORKLOAD_STATE_OWNER = "dispatcher/engine/transitions.py"
"""The one module that writes a Workload's state in the engine (one function per transition)."""


def workload_state_writes(root: Path) -> list[str]:
    """Where a dispatcher module other than the owner writes ``workloads.state`` in the engine's rows: a
    ``set_w(state=...)``, or a ``WorkloadState`` member passed to ``initial`` / ``transition``."""
    found = []
    for path in sorted((root / "dispatcher").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == WORKLOAD_STATE_OWNER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                node.func.id if isinstance(node.func, ast.Name) else ""
            if name == "set_w" and any(k.arg == "state" for k in node.keywords):
                found.append(f"{rel}:{node.lineno} set_w(state=...)")
            elif name in ("initial", "transition") and any(
                    isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)
                    and a.value.id in ("W", "WorkloadState") for a in node.args):
                found.append(f"{rel}:{node.lineno} {name}(W...)")
    return found


def test_only_the_transitions_module_writes_a_workload_state() -> None:
    assert workload_state_writes(ROOT) == []


@pytest.mark.parametrize("source", ["b.set_w(uid, state=W.PENDING)\n", "row['state'] = transition(s, W.PLACED)\n",
                                    "cols = {'state': initial(WorkloadState.PENDING)}\n"])
def test_a_workload_state_written_elsewhere_is_reported(source: str, tmp_path: Path) -> None:
    (tmp_path / "dispatcher" / "engine").mkdir(parents=True)
    (tmp_path / WORKLOAD_STATE_OWNER).write_text(source)
    (tmp_path / "dispatcher/engine/rounds.py").write_text(source)
    assert [v.split(":")[0] for v in workload_state_writes(tmp_path)] == ["dispatcher/engine/rounds.py"]
