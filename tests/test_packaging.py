"""The production install is what the image runs, and it carries nothing but mkd.

The production wheel is built from this tree and installed into a fresh virtualenv by
``packaging/install-prod.sh`` (the Dockerfile's own install step) with the pins of
``requirements/prod.lock``. There ``mkctl`` and its service commands must work without the simulator
(kubesim, shipped in the separate mkd-sim distribution) and without the embedded broker (amqtt). The
lock files must pin every dependency the two pyproject files declare, at versions those declare.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# The production install must not see this source tree (a PYTHONPATH set by whoever runs the tests).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
PRODUCTION_PACKAGES = {"federation", "dispatcher", "worker_agent", "mkctl", "migrations"}


def _pyproject(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def _pins(lock: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            pins[_norm(m.group(1))] = m.group(2)
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(extras: bool) -> list[Requirement]:
    root = _pyproject(ROOT / "pyproject.toml")["project"]
    reqs = [Requirement(r) for r in root["dependencies"]]
    if extras:
        for group in root["optional-dependencies"].values():
            reqs += [Requirement(r) for r in group]
        reqs += [Requirement(r) for r in _pyproject(ROOT / "sim" / "pyproject.toml")["project"]["dependencies"]]
    return [r for r in reqs if _norm(r.name) not in {"mkd", "mkd-sim"}]


@pytest.mark.parametrize("lock,extras", [("dev.lock", True), ("prod.lock", False)])
def test_lock_pins_every_declared_dependency_within_its_bounds(lock: str, extras: bool) -> None:
    pins = _pins(ROOT / "requirements" / lock)
    problems = []
    for req in _declared(extras):
        pinned = pins.get(_norm(req.name))
        if pinned is None:
            problems.append(f"{req.name} is declared but not pinned")
        elif not req.specifier.contains(pinned, prereleases=True):
            problems.append(f"{req.name}=={pinned} does not satisfy {req}")
    assert not problems, f"requirements/{lock} is stale (run `make lock`): " + "; ".join(problems)


def test_production_lock_runs_the_versions_ci_tests() -> None:
    dev, prod = _pins(ROOT / "requirements" / "dev.lock"), _pins(ROOT / "requirements" / "prod.lock")
    assert set(prod) <= set(dev), f"only in prod.lock: {sorted(set(prod) - set(dev))}"
    assert {n: v for n, v in prod.items() if dev[n] != v} == {}
    assert "amqtt" not in prod and "pytest" not in prod


def test_dockerfile_installs_every_production_package_and_nothing_else() -> None:
    text = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", text, flags=re.M))
    assert copied == PRODUCTION_PACKAGES
    include = _pyproject(ROOT / "pyproject.toml")["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in include} == PRODUCTION_PACKAGES
    assert "install-prod.sh" in text and re.search(r"^USER 65532", text, flags=re.M)
    assert re.search(r'^ENTRYPOINT \["mkctl"\]', text, flags=re.M)


@pytest.fixture(scope="module")
def production_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mkd wheel, built from this tree and installed the way the image installs it."""
    if shutil.which("sh") is None:
        pytest.skip("needs a POSIX sh to run packaging/install-prod.sh")
    tmp = tmp_path_factory.mktemp("prod")
    wheels, venv, src = tmp / "wheels", tmp / "venv", tmp / "src"
    # What the Dockerfile's first stage copies, so nothing else in the tree (a stale build/) can leak in.
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in PRODUCTION_PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
                   check=True, cwd=tmp, capture_output=True)
    subprocess.run(["sh", str(ROOT / "packaging" / "install-prod.sh"), str(wheels), str(venv)],
                   check=True, cwd=tmp, capture_output=True, env=CLEAN_ENV)
    return venv


@pytest.mark.slow
def test_production_wheel_carries_no_simulator_and_no_tests(production_venv: Path) -> None:
    wheel = next((production_venv.parent / "wheels").glob("mkd-*.whl"))
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist() if "/" in n}
    assert {t for t in tops if not t.endswith(".dist-info")} == PRODUCTION_PACKAGES
    names = zipfile.ZipFile(wheel).namelist()
    assert "migrations/alembic.ini" in names or any(n.endswith("alembic.ini") for n in names)
    assert any(n.startswith("federation/kinds/crds/") and n.endswith(".yaml") for n in names)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--help"], ["dispatcher", "--help"], ["agent", "--help"], ["db", "--help"]])
def test_mkctl_runs_in_the_production_install(production_venv: Path, argv: list[str]) -> None:
    done = subprocess.run([str(production_venv / "bin" / "mkctl"), *argv], capture_output=True, text=True,
                          cwd=production_venv, timeout=60, env=CLEAN_ENV)
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout


@pytest.mark.slow
def test_kubectl_runs_mkd_as_its_plugin(production_venv: Path) -> None:
    """``kubectl-mkd`` is installed next to ``mkctl`` (kubectl's plugin convention): ``kubectl mkd ...``."""
    plugin = production_venv / "bin" / "kubectl-mkd"
    assert plugin.exists(), "the mkd package installs no kubectl-mkd"
    done = subprocess.run([str(plugin), "why", "--help"], capture_output=True, text=True, cwd=production_venv,
                          timeout=60, env=CLEAN_ENV)
    assert done.returncode == 0 and "kubectl mkd why" in done.stdout, done.stdout + done.stderr
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the plugin is there, kubectl's finding it is not checked")
    env = {**CLEAN_ENV, "PATH": f"{production_venv / 'bin'}:{CLEAN_ENV.get('PATH', '/usr/bin:/bin')}"}
    done = subprocess.run([kubectl, "mkd", "why", "--help"], capture_output=True, text=True, cwd=production_venv,
                          timeout=60, env=env)
    assert done.returncode == 0 and "kubectl mkd why" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_production_install_has_no_simulator_broker_or_test_tools(production_venv: Path) -> None:
    probe = (
        "import importlib.util as u, sys\n"
        "import mkctl.main, dispatcher.app, worker_agent.app\n"
        "print(','.join(m for m in ('kubesim', 'amqtt', 'pytest', 'hypothesis') if u.find_spec(m)))\n"
        "print('aiohttp' in sys.modules)\n"
    )
    done = subprocess.run([str(production_venv / "bin" / "python"), "-c", probe], capture_output=True,
                          text=True, cwd=production_venv, timeout=60, env=CLEAN_ENV)
    assert done.returncode == 0, done.stderr
    installed, aiohttp_loaded = done.stdout.split("\n")[:2]
    assert installed == "", f"the production install carries {installed}"
    # aiohttp is installed there only because the kubernetes client (>= 36) requires it; mkd never loads it.
    assert aiohttp_loaded == "False"


@pytest.mark.slow
def test_demo_without_the_simulator_says_what_to_install(production_venv: Path) -> None:
    done = subprocess.run([str(production_venv / "bin" / "mkctl"), "demo", "--state-dir", "st",
                           "--examples", str(ROOT / "examples")],
                          capture_output=True, text=True, cwd=production_venv, timeout=60, env=CLEAN_ENV)
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "mkd[sim]" in lines[0], done.stderr
