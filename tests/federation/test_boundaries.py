"""The import boundaries, checked by reading every module's imports (including ones inside functions).

* ``kubernetes`` only in federation/kube.py; ``aiomqtt`` / ``paho`` only in federation/mqtt.py;
  ``amqtt`` only in federation/embedded_broker.py (kubesim's own tests, test helpers and benchmark may drive it
  with the official client directly, to prove the emulator speaks its dialect);
* the dispatcher and the agent never import each other; federation imports neither;
* production code (dispatcher, worker_agent, federation) never imports kubesim — tests, bench and
  mkctl's demo may.
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
