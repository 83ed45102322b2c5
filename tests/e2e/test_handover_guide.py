"""docs/HANDOVER.md's guide, run as written against the demo's own set-up.

The demo's federation (``mkctl.demo.topology_options``: the handover webhook served and registered as
``deploy/components/handover-webhook`` does) with the demo's queue set submitted (``demo_examples``,
``submit``), then every shell block of the guide's section in a real shell, as the guide's second
terminal runs them: the working directory holds this demo's ``state/`` and this tree's ``demo/`` and
virtualenv, so the guide's ``$PWD/...`` lines mean what they mean after ``make demo``. Each step's effect
is checked on the manager: what the shadow report says, which Jobs the webhook routed (exactly those whose
stable share is under the percentage), that mkd runs what it was given. Then the two ways a Route policy
routes nothing, each said as a ``RoutesNothing`` Event on the policy and under ``mkctl handover status``.
On the same set-up, every command the demo prints (after its run, and with ``--keep-running``) runs as
printed.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.handover.policy import bucket
from federation import labels
from federation.errors import NotFound
from federation.kube import EVENTS, Resource
from mkctl import jobs as samples_mod
from mkctl.demo import DemoOptions, demo_examples, submit, topology_options
from mkctl.topology import Topology
from tests.e2e.conftest import NotYet, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kubesim_only(
    "the demo's webhook listens on this machine's loopback, out of a real API server's reach"),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="the guide is kubectl commands: kubectl is not installed")]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "HANDOVER.md"
SECTION = "## The guide, in the demo"
NS = "team-a"
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
POLICIES = Resource("handover.mkd.dev", "v1alpha1", "handoverpolicies", "HandoverPolicy", namespaced=False)
WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                    "MutatingWebhookConfiguration", namespaced=False)


def guide_blocks() -> list[str]:
    section = GUIDE.read_text(encoding="utf-8").partition(SECTION)[2].partition("\n## ")[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


class Shell:
    """The guide's second terminal: ``bash`` in ``cwd`` with the guide's exports, run block by block."""

    def __init__(self, cwd: Path, exports: str) -> None:
        self.cwd = cwd
        self.exports = exports
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("MKD_") and k not in ("KUBECONFIG", "VIRTUAL_ENV")}

    async def run(self, block: str) -> tuple[str, str]:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-e", "-o", "pipefail", "-c", f"{self.exports}\n{block}", cwd=self.cwd, env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 180)
        assert proc.returncode == 0, f"the guide's block failed ({proc.returncode}):\n{block}\n{out.decode()}{err.decode()}"
        return out.decode(), err.decode()


@pytest.fixture
async def demo(tmp_path: Path, mqtt_url: str, topic_root: str) -> AsyncIterator[tuple[Topology, Shell]]:
    """The demo's federation and its queue set (demo/queues/: team-a's LocalQueue), SQLite in ./state as
    ``make demo`` has it, and the shell the guide is typed into."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "mkctl").exists():
        pytest.skip(f"mkctl is not installed next to {sys.executable}: the guide's PATH line finds no mkctl")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bin").symlink_to(bin_dir)
    (tmp_path / "demo").symlink_to(ROOT / "demo")
    opts = DemoOptions(state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=None, timeout=60.0,
                       keep_running=True, examples=samples_mod.queues_dir(), topic_root=topic_root)
    blocks = guide_blocks()
    assert blocks[0].strip() == "make demo DEMO_ARGS=--keep-running", blocks[0]
    assert "export KUBECONFIG=$PWD/state/sim/manager.kubeconfig" in blocks[1], blocks[1]
    examples = demo_examples(opts)
    async with Topology(topology_options(opts, topic_root)) as top:
        await top.wait_for_clusters()
        await submit(top, examples)
        yield top, Shell(tmp_path, blocks[1])
        top.check_running()


def table(text: str, first: str) -> list[list[str]]:
    """The rows of a printed table whose first cell is ``first``, split on runs of spaces."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.startswith(first + " ")]


async def managed_by(top: Topology, name: str) -> str | None:
    job = await top.manager.get(PYTORCHJOBS, name, NS)
    return (job["spec"].get("runPolicy") or {}).get("managedBy")  # type: ignore[no-any-return]


async def succeeded(top: Topology, names: list[str]) -> bool | NotYet:
    waiting = []
    for name in names:
        status = (await top.manager.get(PYTORCHJOBS, name, NS)).get("status") or {}
        if not any(c["type"] == "Succeeded" and c["status"] == "True" for c in status.get("conditions", [])):
            waiting.append(name)
    return NotYet(", ".join(waiting)) if waiting else True


async def policy_events(top: Topology, policy: str) -> list[dict[str, Any]]:
    items = (await top.manager.list(EVENTS, "default")).items
    return [e for e in items if e["involvedObject"].get("name") == policy
            and e["involvedObject"].get("kind") == "HandoverPolicy"]


async def test_the_guide_runs_as_written_in_the_demo(demo: tuple[Topology, Shell]) -> None:
    top, shell = demo
    steps = guide_blocks()[2:]
    assert len(steps) == 4, "the guide's steps changed: update this test with them"
    shadow, route, everything, rollback = steps

    # 1. Shadow: nothing routed; the report counts the three Jobs, all of which mkd would accept.
    out, _ = await shell.run(shadow)
    assert [await managed_by(top, f"shadow-{i}") for i in (1, 2, 3)] == [None, None, None]
    rows = table(out, NS)
    assert rows and rows[0][1:4] == ["PyTorchJob", "3", "3"], out
    assert "worker-" in rows[0][5], out  # WOULD RUN ON names clusters with room

    # 2. Route 10%: exactly the Jobs whose stable share is under 10 were given mkd's managedBy.
    out, _ = await shell.run(route)
    shown = {r[0]: r[1] for r in (re.split(r"\s+", line.strip()) for line in out.splitlines())
             if r and r[0].startswith("route-")}
    want = {f"route-{i}": labels.MULTIKUEUE if bucket(NS, f"route-{i}") < 10 else "<none>" for i in range(1, 21)}
    assert shown == want, out
    assert labels.MULTIKUEUE in shown.values(), "the guide's 10% routes none of its 20 Jobs: pick other names"
    assert table(out, NS), f"mkctl handover status printed no counts for {NS}:\n{out}"

    # 3. Route 100%: every new Job goes to mkd.
    out, _ = await shell.run(everything)
    assert out.strip().splitlines()[-1] == labels.MULTIKUEUE, out
    assert {await managed_by(top, f"all-{i}") for i in (1, 2, 3)} == {labels.MULTIKUEUE}

    # 5. Roll back: drained (nothing new routed), then the policy is gone.
    await shell.run(rollback)
    assert await managed_by(top, "after-drain") is None
    with pytest.raises(NotFound):
        await top.manager.get(POLICIES, "team-a")

    routed = [n for n in (*want, "all-1", "all-2", "all-3") if await managed_by(top, n) == labels.MULTIKUEUE]
    await wait_for(lambda: succeeded(top, routed), "the Jobs routed to mkd run to their end", top=top, within=120)


async def test_a_route_policy_that_routes_nothing_says_why(demo: tuple[Topology, Shell]) -> None:
    top, shell = demo
    await shell.run("""kubectl apply -f - <<EOF
apiVersion: handover.mkd.dev/v1alpha1
kind: HandoverPolicy
metadata: {name: team-b}
spec: {mode: Route, percent: 100, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: team-b}}}
EOF""")

    async def said(reason: str, words: str) -> dict[str, Any] | NotYet:
        events = [e for e in await policy_events(top, "team-b") if e["reason"] == reason]
        return events[-1] if events and words in events[-1]["message"] else NotYet(repr(events))

    # team-b is not opted in: the webhook is never called there
    event = await wait_for(lambda: said("RoutesNothing", "kubectl label namespace team-b handover.mkd.dev/enabled=true"),
                           "RoutesNothing for an unlabelled namespace", top=top, within=30)
    assert event["type"] == "Warning"
    _, err = await shell.run("mkctl handover status")
    assert "HandoverPolicy team-b routes nothing" in err and "handover.mkd.dev/enabled=true" in err, err

    # opted in: routing again, said once; status has no warning left
    await shell.run("kubectl label namespace team-b handover.mkd.dev/enabled=true")
    await wait_for(lambda: said("Routing", "again"), "Routing once team-b is labelled", top=top, within=30)
    _, err = await shell.run("mkctl handover status")
    assert "routes nothing" not in err, err

    # no webhook registered at all
    await top.manager.delete(WEBHOOKS, "mkd-handover")
    await wait_for(lambda: said("RoutesNothing", "no MutatingWebhookConfiguration"),
                   "RoutesNothing without the webhook", top=top, within=30)
    _, err = await shell.run("mkctl handover status -o json")
    assert "deploy/components/handover-webhook" in err, err


async def test_what_the_demo_suggests_runs_as_printed(demo: tuple[Topology, Shell]) -> None:
    from io import StringIO

    from rich.console import Console

    from mkctl.admin import mkctl_command
    from mkctl.demo import inspect_hints, print_running

    top, _ = demo
    out = StringIO()
    print_running(Console(file=out, width=1000, force_terminal=False),
                  {**top.describe(), "job": "team-a/low-1", "logs_job": "team-b/borrower"})
    printed = [line.strip() for line in out.getvalue().splitlines()]
    mkctl = mkctl_command()
    shown = [line for line in printed if line.startswith((f"{mkctl} ", "kubectl ", "export "))]
    shown += inspect_hints(top.database_url, "team-a/low-1")
    exports = [line for line in shown if line.startswith("export ")]
    assert len(exports) == 3 and any(line.startswith("export PATH=") for line in exports), printed
    shell = Shell(Path.cwd(), "\n".join(exports))  # where the demo ran: mkctl is spelled from there
    commands = [line for line in shown if not line.startswith("export ")]
    assert len(commands) >= 10 and any("--server" in c for c in commands), printed
    pods = next(c for c in commands if " pods team-b/borrower " in c)

    async def placed() -> bool | NotYet:  # the demo prints these once its jobs reached their end
        proc = await asyncio.create_subprocess_exec("bash", "-c", pods, cwd=Path.cwd(), env=shell.env,
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL)
        return True if await proc.wait() == 0 else NotYet("team-b/borrower has no pods yet")
    await wait_for(placed, "team-b/borrower placed", top=top, within=60, every=1.0)
    for command in commands:
        if {"-w", "-f"} & set(command.split()):  # a watch, a log followed: it prints, then runs until ^C
            out_text, _ = await shell.run(f"timeout 5 {command} || [ $? = 124 ]")
            assert out_text.strip() or "-f" in command.split(), command  # this sample's pods print nothing
            continue
        await shell.run(command)
    _, err = await shell.run("mkctl handover status")  # the PATH line puts mkctl (and kubectl-mkd) there
    assert "error" not in err, err


READ_VERBS = {"workloads", "placements", "clusters", "events", "queues", "why", "handover", "get", "describe", "mkd"}
"""What a user types to look at the demo (mkctl's read verbs, kubectl get/describe and its mkd plugin)."""


async def test_the_readmes_commands_run_against_the_demo(tmp_path: Path, mqtt_url: str, topic_root: str) -> None:
    """Every command the README and docs/ show in a code block for looking at a federation (and the kubectl
    plugin's, named inline) runs for real against ``make demo``'s full set (examples/ and demo/queues/), from
    the guide's shell set-up."""
    from tests.test_docs import all_commands

    shown = sorted({c.text for c in all_commands() if (c.block or c.text.startswith("kubectl mkd ")) and (
        (words := shlex.split(c.text))[0] in ("mkctl", ".venv/bin/mkctl", "kubectl") and len(words) > 1
        and words[1] in READ_VERBS and not re.search(r"\b[A-Z]{2,}\b|…|\.\.\.|<|--server", c.text))})
    assert {".venv/bin/mkctl why default/too-large", "kubectl mkd why default/too-large"} <= set(shown), shown
    bin_dir = Path(sys.executable).parent
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bin").symlink_to(bin_dir)
    opts = DemoOptions(state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=None, timeout=60.0,
                       keep_running=True, examples=None, topic_root=topic_root)
    examples = demo_examples(opts)
    async with Topology(topology_options(opts, topic_root)) as top:
        await top.wait_for_clusters()
        await submit(top, examples)
        shell = Shell(tmp_path, guide_blocks()[1])

        async def claimed() -> bool | NotYet:
            out = await asyncio.create_subprocess_exec(
                "bash", "-c", f"{shell.exports}\nmkctl why default/too-large && mkctl workloads show "
                "default/pytorch-simple", cwd=tmp_path, env=shell.env, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
            return True if await out.wait() == 0 else NotYet("not claimed yet")
        await wait_for(claimed, "the demo's Jobs claimed", top=top, within=60, every=1.0)
        for command in shown:
            if "-w" in command.split():  # a watch: it prints, then runs until ^C
                out, _ = await shell.run(f"timeout 5 {command} || [ $? = 124 ]")
            else:
                out, _ = await shell.run(command)
            assert out.strip(), f"{command} printed nothing"
        top.check_running()
