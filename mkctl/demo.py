"""``mkctl demo``: the whole federation in one process, the sample jobs submitted, their placements shown live.

Builds the :class:`~mkctl.topology.Topology` (kubesim manager + three workers, broker, database,
dispatcher, agents), installs the TrainJob runtimes and Kueue's queue objects of ``demo/queues/``
(two ClusterQueues in a cohort, one borrowing, a third for the other samples, a LocalQueue per team
namespace, two WorkloadPriorityClasses) and submits the jobs of ``examples/`` and ``demo/queues/`` to
the manager cluster, then refreshes a table of placements — job, kind, queue, cluster, state,
reason, elapsed — with a line per ClusterQueue (usage, borrowed) and the queueing events (a
preemption, a borrow; :mod:`mkctl.demoqueues`) until every job reached its expected end (finished,
pending with a reason, or left alone because another controller owns it) or ``--timeout`` passes. A
terminal gets a live rich table; anything else (CI) gets one plain line per change. Ends with a
summary and the ``mkctl`` commands to look at what happened; exits 0 only when every job ended as
expected and, with the queue set, a borrow and a preemption were shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import shutil
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from mkctl import jobs as samples_mod
from mkctl.admin import mkctl_command
from mkctl.demoqueues import BORROWS, PREEMPTED, QueuePanel, read_cluster_queues
from mkctl.errors import EXIT_UNFINISHED, CommandFailed
from mkctl.jobs import Examples, Observation, Sample
from mkctl.output import Column, duration, table
from mkctl.services import redact
from mkctl.topology import MANAGER, Topology, TopologyOptions

log = logging.getLogger(__name__)

STATE_STYLE = {"Succeeded": "green", "Failed": "red", "Rejected": "red", "Running": "cyan",
               "Pending": "yellow", "Untouched": "magenta", "Touched": "red", "Missing": "red"}


# --- submitting ------------------------------------------------------------------------------------


async def submit(top: Topology, examples: Examples) -> dict[str, str]:
    """Namespaces and runtimes into every cluster (the dispatcher and agents both read runtimes),
    then the jobs into the manager cluster only. Returns the jobs submitted later, each with when."""
    from federation.errors import AlreadyExists
    from federation.kube import NAMESPACES, Resource

    for cluster in top.cluster_names:
        kube = top.kubes[cluster]
        for ns in sorted(examples.namespaces):
            with contextlib.suppress(AlreadyExists):
                await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for runtime in examples.runtimes:
            namespaced = runtime["kind"] == "TrainingRuntime"
            group, _, version = runtime["apiVersion"].partition("/")
            res = Resource(group, version, runtime["kind"].lower() + "s", runtime["kind"], namespaced)
            where: str | None = runtime["metadata"].get("namespace", "default") if namespaced else None
            with contextlib.suppress(AlreadyExists):
                await kube.create(res, runtime, where)
    for obj in examples.queue_objects:  # Kueue's objects, before the Jobs that name them
        plural = obj["kind"].lower() + ("es" if obj["kind"].endswith("s") else "s")
        group, _, version = obj["apiVersion"].partition("/")
        res = Resource(group, version, plural, obj["kind"], obj["kind"] == "LocalQueue")
        with contextlib.suppress(AlreadyExists):
            await top.manager.create(res, obj, obj["metadata"].get("namespace"))
    later = []
    when: dict[str, str] = {}
    by_key = {s.key: s for s in examples.samples}
    for sample in examples.samples:
        annotations = sample.manifest["metadata"].get("annotations") or {}
        delay = annotations.get(SUBMIT_AFTER_ANNOTATION)
        after = [k.strip() for k in str(annotations.get(SUBMIT_WHEN_ADMITTED_ANNOTATION) or "").split(",") if k.strip()]
        if after:  # a preemptor arriving once the Workloads it will meet hold their quota
            unknown = [k for k in after if k not in by_key]
            if unknown:
                raise CommandFailed(f"{sample.source}: {SUBMIT_WHEN_ADMITTED_ANNOTATION} names {', '.join(unknown)}, "
                                    "which the demo does not submit; name jobs of the same set")
            later.append(asyncio.create_task(_submit_when_admitted(top.manager, sample, [by_key[k] for k in after])))
            when[sample.key] = f"submitted once {', '.join(after)} hold their quota"
        elif delay:  # shown as submitted later
            later.append(asyncio.create_task(_submit_later(top.manager, sample, float(delay))))
            when[sample.key] = f"submitted {delay}s after the others"
        else:
            await create_job(top.manager, sample)
    _LATER.extend(later)
    return when


_LATER: list[asyncio.Task[Any]] = []
SUBMIT_AFTER_ANNOTATION = "mkd.dev/demo-submit-after"
"""Seconds after the others a demo job is submitted."""
SUBMIT_WHEN_ADMITTED_ANNOTATION = "mkd.dev/demo-submit-when-admitted"
"""``ns/name,...``: a demo job is submitted once these Jobs hold their quota (``QuotaReserved=True``)."""
ADMITTED_WAIT_SECONDS = 60.0
"""How long a job waits for those before it is submitted anyway (the demo then says what it lacked)."""


async def _submit_later(kube: Any, sample: Sample, seconds: float) -> None:
    await asyncio.sleep(seconds)
    await create_job(kube, sample)


async def _submit_when_admitted(kube: Any, sample: Sample, others: Sequence[Sample]) -> None:
    deadline = time.monotonic() + ADMITTED_WAIT_SECONDS
    waiting = list(others)
    while time.monotonic() < deadline:
        jobs = await asyncio.gather(*(read_job(kube, s) for s in waiting))
        waiting = [s for s, j in zip(waiting, jobs, strict=True)
                   if ((samples_mod.condition(j, "QuotaReserved") or {}) if j else {}).get("status") != "True"]
        if not waiting:
            break
        await asyncio.sleep(0.5)
    else:
        log.warning("%s submitted although %s do not hold their quota after %gs", sample.key,
                    ", ".join(s.key for s in waiting), ADMITTED_WAIT_SECONDS)
    await create_job(kube, sample)


async def create_job(kube: Any, sample: Sample) -> dict[str, Any]:
    from federation.kinds.registry import by_api
    from federation.kube import resource_for

    kind = by_api(sample.manifest["apiVersion"], sample.kind)
    assert kind is not None, sample.source
    created: dict[str, Any] = await kube.create(resource_for(kind), sample.manifest,  # type: ignore[arg-type]
                                                sample.namespace)
    return created


async def read_job(kube: Any, sample: Sample) -> dict[str, Any] | None:
    from federation.errors import NotFound
    from federation.kinds.registry import by_api
    from federation.kube import resource_for

    kind = by_api(sample.manifest["apiVersion"], sample.kind)
    assert kind is not None
    try:
        job: dict[str, Any] = await kube.get(resource_for(kind), sample.name,  # type: ignore[arg-type]
                                             sample.namespace)
        return job
    except NotFound:
        return None


async def read_all(kube: Any, samples: Sequence[Sample]) -> dict[str, dict[str, Any] | None]:
    jobs = await asyncio.gather(*(read_job(kube, s) for s in samples))
    return {s.key: j for s, j in zip(samples, jobs, strict=True)}


async def observe_all(kube: Any, samples: Sequence[Sample]) -> dict[str, Observation]:
    jobs = await read_all(kube, samples)
    return {s.key: samples_mod.observe(s, jobs[s.key]) for s in samples}


# --- the database's view (optional: cluster names and reasons as the dispatcher recorded them) ------


class PlacementReader:
    """Reads the dispatcher's placements for the table; silently absent if the query module is not."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._engine: Any = None

    async def rows(self) -> dict[str, Mapping[str, Any]]:
        try:
            from sqlalchemy.ext.asyncio import AsyncSession

            from dispatcher.db import make_engine
            from dispatcher.db.queries import listing
            from mkctl.admin import as_dict

            if self._engine is None:
                self._engine = make_engine(self.database_url)
            async with AsyncSession(self._engine) as session:
                found = await listing.list_placements(session)
            out: dict[str, Mapping[str, Any]] = {}
            for row in found:
                view = as_dict(row)
                out[f"{view.get('namespace')}/{view.get('name')}"] = view
            return out
        except Exception as exc:  # the table works from the manager cluster alone
            log.debug("placements not read from the database: %s", exc)
            return {}

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()


def merge(obs: Observation, row: Mapping[str, Any] | None) -> Observation:
    if row:
        if obs.state not in ("Waiting", "Pending"):  # the row is the latest placement: a waiting Job left it
            obs.cluster = obs.cluster or str(row.get("cluster") or "")
        obs.queue = str(row.get("queue") or obs.queue)
        if obs.state in ("Waiting", "Pending") and row.get("reason") and not obs.reason:
            obs.reason = str(row["reason"])
    return obs


# --- showing ----------------------------------------------------------------------------------------


@dataclass
class Progress:
    samples: list[Sample]
    observed: dict[str, Observation]
    started: float
    queues: QueuePanel = field(default_factory=QueuePanel)
    later: dict[str, str] = field(default_factory=dict)
    """Jobs the demo submits later, with when (shown until they exist)."""

    def observe(self, sample: Sample, job: Mapping[str, Any] | None) -> Observation:
        obs = samples_mod.observe(sample, job)
        if job is None and sample.key in self.later:
            obs.state, obs.reason = "Waiting", self.later[sample.key]
        return obs

    @property
    def done(self) -> int:
        return sum(1 for s in self.samples if s.key in self.observed
                   and samples_mod.reached(s, self.observed[s.key]))


def render(progress: Progress) -> RenderableType:
    """The live view: the jobs, then (with queues) a line per ClusterQueue and the queueing events."""
    parts: list[RenderableType] = [render_table(progress)]
    panel = progress.queues
    if panel.lines:
        cqs = Table(title="ClusterQueues (kubectl get clusterqueues)", title_justify="left")
        for header in ("clusterqueue", "cohort", "pending", "admitted", "usage of nominal quota", "borrowed"):
            cqs.add_column(header)
        for q in panel.lines:
            cqs.add_row(q.name, q.cohort or "-", str(q.pending), str(q.admitted), q.usage or "-",
                        Text(q.borrowed, style="bold yellow") if q.borrowed else Text("-"))
        parts.append(cqs)
    if panel.events:
        events = Table(title="queueing events", title_justify="left")
        for header in ("at", "event", "job", "what happened"):
            events.add_column(header, overflow="fold", max_width=90 if header == "what happened" else None)
        for e in panel.events:
            events.add_row(f"{e.at:.1f}s", Text(e.what, style="bold red" if e.what == PREEMPTED else "bold yellow"),
                           e.job, e.message)
        parts.append(events)
    return Group(*parts)


def render_table(progress: Progress) -> Table:
    table = Table(title="mkd placements", title_justify="left", expand=False,
                  caption=f"{progress.done}/{len(progress.samples)} at their expected end · "
                          f"{duration(time.monotonic() - progress.started)} elapsed",
                  caption_justify="left")
    for header in ("job", "kind", "queue", "cluster", "state", "reason", "elapsed"):
        table.add_column(header, overflow="fold", max_width=60 if header == "reason" else None)
    for sample in progress.samples:
        obs = progress.observed.get(sample.key)
        if obs is None:
            table.add_row(sample.key, sample.kind, "", "", "Submitting", "", "")
            continue
        mark = " ✓" if samples_mod.reached(sample, obs) else ""
        table.add_row(sample.key, obs.kind, obs.queue, obs.cluster or "-",
                      Text(obs.state + mark, style=STATE_STYLE.get(obs.state, "")),
                      obs.reason or "-", f"{obs.elapsed():.1f}s")
    return table


class View:
    """Live rich table on a terminal; one plain line per change elsewhere (CI has no TTY)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self._last: dict[str, tuple[str, str, str]] = {}

    def __enter__(self) -> View:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def show(self, progress: Progress) -> None:
        if self.live is not None:
            self.live.update(render(progress))
            return
        kind_width = max((len(s.kind) for s in progress.samples), default=11)  # LeaderWorkerSet: 15
        for sample in progress.samples:
            obs = progress.observed.get(sample.key)
            if obs is None:
                continue
            now = (obs.state, obs.cluster, obs.reason)
            if self._last.get(sample.key) != now:
                self._last[sample.key] = now
                self.console.print(
                    f"{time.monotonic() - progress.started:6.1f}s  {sample.key:<36} {obs.kind:<{kind_width}} "
                    f"queue={obs.queue:<8} cluster={obs.cluster or '-':<9} {obs.state:<10} {obs.reason}",
                    markup=False, highlight=False, soft_wrap=True)
        lines, events = progress.queues.changes()
        for line in [q.plain() for q in lines] + [e.plain() for e in events]:
            self.console.print(f"{time.monotonic() - progress.started:6.1f}s  {line}",
                               markup=False, highlight=False, soft_wrap=True)


# --- the run ------------------------------------------------------------------------------------------


@dataclass
class DemoOptions:
    state_dir: Path
    mqtt_url: str | None
    database_url: str | None
    timeout: float
    keep_running: bool
    examples: Path | None
    topic_root: str | None = None
    queues: bool = True
    """Install ``demo/queues/`` (ClusterQueues, LocalQueues, priority classes and its jobs) with the
    default examples; False: open mode, every Job admitted without quota."""
    kinds_file: Path | None = None
    """The examples' declarations file (examples/trainingrun/kinds.yaml): every service reads it."""
    crds: list[dict[str, Any]] = field(default_factory=list)
    """The CRDs of the kinds it declares, installed into every cluster."""


def demo_examples(opts: DemoOptions) -> Examples:
    """The jobs and queue objects the demo submits: ``--examples`` (default examples/) and, with the
    default examples and queues on, demo/queues/; sets ``opts``' declared kinds and CRDs from them, so call it
    before the topology is built."""
    examples = samples_mod.load_examples(opts.examples, declared=True)
    if len(examples.kinds_files) > 1:
        raise CommandFailed(f"examples: {len(examples.kinds_files)} declarations files "
                            f"({', '.join(map(str, examples.kinds_files))}); the services read one: merge them")
    if not examples.samples:
        raise CommandFailed(f"examples: no job manifests found under {opts.examples or samples_mod.examples_dir()}; "
                            "pass --examples DIR")
    if opts.examples is None and opts.queues:
        queue_set = samples_mod.queues_dir()
        extra = samples_mod.load_examples(queue_set)
        if not extra.queue_objects:
            raise CommandFailed(f"queues: no Kueue objects found under {queue_set}; run from the source tree, or "
                                "pass --no-queues to run without ClusterQueues (open mode)")
        examples.add(extra)
    opts.kinds_file = examples.kinds_files[0] if examples.kinds_files else None  # the services read what
    opts.crds = examples.crds  # the samples declare, and the clusters get their kinds' CRDs
    return examples


async def run_demo(opts: DemoOptions, console: Console) -> list[str]:
    """Run the demo; return the problems (empty: every job ended as expected)."""
    examples = demo_examples(opts)
    # kubesim keeps its clusters in memory, so every demo starts with empty ones; the SQLite file
    # of a previous run would describe jobs that no longer exist, so it goes too.
    reset_state(opts.state_dir, own_database=opts.database_url is None)
    started = time.monotonic()
    console.print(f"[bold]mkd demo[/] · state in {opts.state_dir}/ · starting kubesim (manager + 3 workers), "
                  f"{'MQTT ' + redact(opts.mqtt_url) if opts.mqtt_url else 'the embedded MQTT broker'}, "
                  f"{'database ' + redact(opts.database_url) if opts.database_url else 'SQLite'}, "
                  "the dispatcher, 3 agents and their fencers…")
    # On a shared broker, two demos (or a demo and a test run) must not hear each other: a topic root
    # of their own, which also makes the MQTT client ids unique (see Topology).
    topic_root = opts.topic_root or ("mkd/v1" if opts.mqtt_url is None else f"mkd-demo-{uuid.uuid4().hex[:6]}/v1")
    async with Topology(topology_options(opts, topic_root)) as top:
        known = await top.wait_for_clusters()
        queues = sum(1 for o in examples.queue_objects if o["kind"] == "ClusterQueue")
        console.print(f"federation up in {time.monotonic() - started:.1f}s (dispatcher knows "
                      f"{', '.join(sorted(known)) or 'no cluster yet'}); submitting {len(examples.samples)} "
                      f"jobs and {len(examples.runtimes)} runtime(s) from examples/"
                      + (f" (kinds declared in {_shown(opts.kinds_file)})" if opts.kinds_file else "")
                      + (f", {queues} ClusterQueues and their LocalQueues from demo/queues/" if queues else
                         " (open mode: no ClusterQueue)"))
        later = await submit(top, examples)
        reader = PlacementReader(top.database_url)
        progress = Progress(examples.samples, {}, time.monotonic(), later=later)
        problems: list[str] = []
        try:
            with View(console) as view:
                problems = await follow(top, progress, reader, view, opts.timeout)
        finally:
            await reader.close()
        problems += queue_problems(examples, progress.queues)
        problems += [f"{service} degraded: {line}" for service, lines in (await top.degraded()).items()
                     for line in lines]
        summary(console, top, progress, opts, problems)
        problems += await show_logs(console, top, LOGS_JOB)
        if opts.keep_running:
            shown = next((s.key for s in examples.samples if s.expect == "Untouched"), examples.samples[0].key)
            keys = [s.key for s in examples.samples if s.expect == "Succeeded"]
            await keep_running(console, top, shown, LOGS_JOB if LOGS_JOB in keys else next(iter(keys), None))
    return problems


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it (``examples/...``)."""
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def topology_options(opts: DemoOptions, topic_root: str) -> TopologyOptions:
    """The demo's federation: the topology of deploy/, a fencer next to each worker's agent and the
    handover webhook included."""
    return TopologyOptions(state_dir=opts.state_dir, mqtt_url=opts.mqtt_url, database_url=opts.database_url,
                           topic_root=topic_root, fencers=True, handover_webhook=True, kinds_file=opts.kinds_file,
                           crds=opts.crds)


async def follow(top: Topology, progress: Progress, reader: PlacementReader, view: View,
                 limit: float) -> list[str]:
    deadline = time.monotonic() + limit
    while True:
        top.check_running()
        jobs, cluster_queues = await asyncio.gather(read_all(top.manager, progress.samples),
                                                    read_cluster_queues(top.manager))
        observed = {s.key: progress.observe(s, jobs[s.key]) for s in progress.samples}
        rows = await reader.rows()
        progress.observed = {k: merge(o, rows.get(k)) for k, o in observed.items()}
        progress.queues.update(cluster_queues, jobs, time.monotonic() - progress.started)
        view.show(progress)
        if progress.done == len(progress.samples):
            return []
        settled = all(samples_mod.reached(s, progress.observed[s.key]) or samples_mod.final(progress.observed[s.key])
                      for s in progress.samples) and all(task.done() for task in _LATER)  # none still to submit
        if settled or time.monotonic() > deadline:
            return [f"{s.key} ({s.kind}) expected {s.expect}, is {o.state}" + (f": {o.reason}" if o.reason else "")
                    for s in progress.samples if not samples_mod.reached(s, o := progress.observed[s.key])]
        await asyncio.sleep(0.5)


def queue_problems(examples: Examples, panel: QueuePanel) -> list[str]:
    """With the queue set, the demo promises a borrow and a preemption: say so when one was not shown."""
    if not any(o["kind"] == "ClusterQueue" for o in examples.queue_objects):
        return []
    wanted = {BORROWS: any(o["kind"] == "ClusterQueue" and any(
                  r.get("borrowingLimit") is not None for g in (o.get("spec") or {}).get("resourceGroups") or []
                  for f in g.get("flavors") or [] for r in f.get("resources") or []) for o in examples.queue_objects),
              PREEMPTED: any(SUBMIT_WHEN_ADMITTED_ANNOTATION in (s.manifest["metadata"].get("annotations") or {})
                             for s in examples.samples)}
    return [f"the queueing demo never showed a Job that {what}" + (" another" if what == PREEMPTED else "")
            for what, expected in wanted.items() if expected and not panel.shown(what)]


def summary(console: Console, top: Topology, progress: Progress, opts: DemoOptions, problems: list[str]) -> None:
    if not console.is_terminal:  # the live table was never drawn: print the final one, plain
        rows = [{"job": s.key, "kind": o.kind, "queue": o.queue, "cluster": o.cluster, "state": o.state,
                 "reason": o.reason, "elapsed": f"{o.elapsed():.1f}s"}
                for s in progress.samples if (o := progress.observed.get(s.key)) is not None]
        console.print(table(rows, [Column(h, h) for h in ("job", "kind", "queue", "cluster", "state", "reason",
                                                          "elapsed")], max_width=70),
                      markup=False, highlight=False, soft_wrap=True)
        for e in progress.queues.events:
            console.print(f"{e.at:6.1f}s  {e.plain()}", markup=False, highlight=False, soft_wrap=True)
    for name, amount in sorted(progress.queues.borrowed.items()):
        console.print(f"ClusterQueue {name} borrowed up to {amount} from its cohort", markup=False)
    states = Counter(o.state for o in progress.observed.values())
    clusters = Counter(o.cluster for o in progress.observed.values() if o.cluster)
    console.print()
    console.print(f"[bold]summary[/]: {len(progress.samples)} jobs in {duration(time.monotonic() - progress.started)}"
                  f" · " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                  + (" · placed on " + ", ".join(f"{c}: {n}" for c, n in sorted(clusters.items())) if clusters else ""))
    for sample in progress.samples:
        obs = progress.observed[sample.key]
        if sample.expect == "Pending" and obs.state == "Pending":
            console.print(f"  {sample.key} stays pending: {obs.reason}", markup=False)
        elif sample.expect == "Untouched" and obs.state == "Untouched":
            console.print(f"  {sample.key} was left alone ({obs.reason})", markup=False)
    console.print("\ninspect it with:")
    for cmd in inspect_hints(top.database_url, progress.samples[0].key):
        console.print(f"  {cmd}", markup=False, highlight=False)
    if not opts.keep_running:
        console.print("  (rerun with --keep-running to keep the clusters up and point kubectl at them)",
                      markup=False)
    if problems:
        console.print(f"\n[red]{len(problems)} job(s) did not reach their expected end:[/]")
        for p in problems:
            console.print(f"  {p}", markup=False)


LOGS_JOB = "default/pytorch-simple"
"""The sample whose log the demo prints at the end (its master's, read on its worker through the agent)."""


async def show_logs(console: Console, top: Topology, job: str) -> list[str]:
    """Print the last lines of ``job``'s log as ``mkctl logs`` reads them (through the dispatcher's API, the
    agent and the broker); a problem when that fails and the job ran."""
    import httpx

    if top.api_port is None:
        return []
    namespace, _, name = job.partition("/")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{top.api_port}", timeout=30,
                                 headers={"Authorization": f"Bearer {top.api_token}"}) as api:
        got = await api.get(f"/api/v1/workloads/{namespace}/{name}/logs", params={"tail": 3})
    console.print(f"\n[bold]mkctl logs {job} --tail 3[/] (the master's log, read on "
                  f"{got.headers.get('x-mkd-cluster', '?')} through its agent):", highlight=False)
    if got.status_code == 404 and "no workload" in got.text:
        console.print("  (not submitted in this run)", markup=False)
        return []
    if got.status_code != 200:
        console.print(f"  {got.status_code}: {got.text}", markup=False, highlight=False)
        return [f"mkctl logs {job}: {got.status_code} {got.text}"]
    for line in got.text.splitlines():
        console.print(f"  {line}", markup=False, highlight=False)
    return []


def server_hints(api_url: str, token: str, job: str, logs_job: str | None = LOGS_JOB) -> list[str]:
    """What to try against the running dispatcher's API (printed by ``--keep-running``); ``job`` is the
    ``namespace/name`` of the Job ``workloads show`` shows, ``logs_job`` that of a Job that ran, whose pods
    and log the hints show (None: no such Job in this run)."""
    mkctl = mkctl_command()
    where = f"--server {api_url} --token {shlex.quote(token)}"
    logs = (f"pods {logs_job}", f"logs {logs_job} -f") if logs_job else ()
    return [f"{mkctl} {cmd} {where}" for cmd in (
        "workloads list", f"workloads show {job}", *logs, "clusters cordon worker-1", "clusters drain worker-2",
        "events -w")]


def inspect_hints(database_url: str, job: str) -> list[str]:
    """The commands the demo suggests, spelled so they run as printed from where the demo ran
    (``.venv/bin/mkctl`` after ``make demo``, which puts nothing on PATH)."""
    mkctl = mkctl_command()
    where = f"--database-url {shlex.quote(database_url)}"
    return [f"{mkctl} {cmd} {where}" for cmd in (
        "workloads list", "workloads list -o wide", "workloads list --state pending", f"workloads show {job}",
        "clusters list", "events")]


async def keep_running(console: Console, top: Topology, job: str, logs_job: str | None) -> None:
    print_running(console, {**top.describe(), "job": job, "logs_job": logs_job})
    stop = asyncio.Event()
    from federation.tasks import install_signal_handlers

    remove = install_signal_handlers(stop)
    try:
        while not stop.is_set():
            top.check_running()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    finally:
        remove()


def print_running(console: Console, info: Mapping[str, Any]) -> None:
    """What ``--keep-running`` prints: kubeconfigs, broker and database, the dashboard URL and token,
    commands for the API (``info["job"]``, ``namespace/name``, is the Job they show), the handover
    webhook and the shell set-up of docs/HANDOVER.md's guide."""
    console.print("\n[bold]still running[/] (Ctrl-C to stop). Kubeconfigs:")
    for name, path in info["kubeconfigs"].items():
        console.print(f"  {name:<9} {path}", markup=False)
    console.print(f"  kubectl --kubeconfig {info['kubeconfigs'][MANAGER]} get pytorchjobs,jobs -A", markup=False)
    console.print(f"  MQTT {info['mqtt_url']} (topic root {info['topic_root']}), database {info['database_url']}",
                  markup=False)
    if info.get("dashboard_url"):
        console.print("\n[bold]dashboard[/] (open in a browser; the token is stored in a cookie):", highlight=False)
        console.print(f"  {info['dashboard_url']}", markup=False, highlight=False)
        console.print(f"  token: {info['api_token']}", markup=False, highlight=False)
        console.print("the API, with the same token (also: /metrics, /openapi.json, /healthz, /readyz):", markup=False)
        for cmd in server_hints(info["api_url"], info["api_token"], info.get("job", "default/other-controller"),
                                info.get("logs_job", LOGS_JOB)):
            console.print(f"  {cmd}", markup=False, highlight=False)
    if info.get("handover_webhook"):
        console.print("\n[bold]handover webhook[/] (namespaces labelled handover.mkd.dev/enabled=true; the guide in "
                      "docs/HANDOVER.md runs as written from a shell set up with):", highlight=False)
        console.print(f"  {info['handover_webhook']}", markup=False, highlight=False)
        for line in guide_exports(info):
            console.print(f"  {line}", markup=False, highlight=False)
    if info.get("fencers"):
        console.print("\n[bold]fencers[/] (one per worker: /metrics, /healthz, /readyz):")
        for name, url in info["fencers"].items():
            console.print(f"  {name:<9} {url}/metrics", markup=False, highlight=False)


def guide_exports(info: Mapping[str, Any]) -> list[str]:
    """The environment docs/HANDOVER.md's guide sets, spelled for this run (state dir, database, mkctl)."""
    beside = Path(sys.executable).parent  # where make demo's mkctl (and kubectl-mkd) are
    mkctl = beside if (beside / "mkctl").exists() else None
    lines = [f"export KUBECONFIG={shlex.quote(str(Path(info['kubeconfigs'][MANAGER]).resolve()))}",
             f"export MKD_DATABASE_URL={shlex.quote(info['database_url'])}"]
    if mkctl is not None:
        lines.append(f"export PATH={shlex.quote(str(mkctl))}:$PATH")
    return lines


def reset_state(state_dir: Path, *, own_database: bool) -> None:
    """A demo starts clean: its simulated clusters and (when it owns it) its SQLite file."""
    shutil.rmtree(state_dir / "sim", ignore_errors=True)
    if own_database:
        for suffix in ("", "-wal", "-shm", "-journal"):
            (state_dir / f"mkd.db{suffix}").unlink(missing_ok=True)


def setup_demo_logging(state_dir: Path, console: Console, debug: bool) -> Path:
    """Everything at INFO to ``<state>/demo.log``; only warnings (or all, with --debug) on the console."""
    from rich.logging import RichHandler

    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "demo.log"
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    file_handler = logging.FileHandler(path, mode="w")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    level = logging.DEBUG if debug else logging.WARNING
    screen: logging.Handler
    if console.is_terminal:  # shares the console with the live table, so lines land above it
        screen = RichHandler(console=console, show_path=False, level=level)
    else:
        screen = logging.StreamHandler(sys.stderr)
        screen.setLevel(level)
        screen.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(screen)
    for noisy in ("kubernetes", "aiosqlite", "amqtt", "transitions", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # "Connection pool is full" is urllib3 telling us it closed a spare connection: not news.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    return path


def demo(
    ctx: typer.Context,
    state_dir: Annotated[Path, typer.Option("--state-dir", help="Where kubeconfigs, the SQLite file and the log go.")
                         ] = Path("state"),
    mqtt_url: Annotated[str | None, typer.Option("--mqtt-url", envvar="MKD_DEMO_MQTT_URL", show_default=False,
                                                 help="Use this broker (e.g. Mosquitto) instead of the embedded one.")
                        ] = None,
    database_url: Annotated[str | None, typer.Option(
        "--database-url", envvar="MKD_DEMO_DATABASE_URL", show_default=False,
        help="Use this database (e.g. postgresql+asyncpg://postgres@127.0.0.1/mkd) instead of SQLite.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for every job's end.")] = 150.0,
    keep_running: Annotated[bool, typer.Option("--keep-running", help="Stay up afterwards, printing kubeconfigs.")
                            ] = False,
    examples: Annotated[Path | None, typer.Option("--examples", help="Folder of sample jobs (default: examples/).",
                                                  show_default=False)] = None,
    topic_root: Annotated[str | None, typer.Option(
        "--topic-root", show_default=False,
        help="MQTT topic root (default: mkd/v1 on the embedded broker, a fresh one on --mqtt-url).")] = None,
    queues: Annotated[bool, typer.Option(
        "--queues/--no-queues",
        help="Install demo/queues/ (ClusterQueues in a cohort, LocalQueues, priority classes and its jobs: a borrow "
             "and a preemption) with the default examples; --no-queues runs in open mode.")] = True,
) -> None:
    """Run the whole federation in one process on embedded defaults and submit the sample jobs."""
    debug = bool(getattr(ctx.find_root().obj, "debug", False))
    console = Console(highlight=False, soft_wrap=not sys.stdout.isatty())
    log_path = setup_demo_logging(state_dir, console, debug)
    opts = DemoOptions(state_dir, mqtt_url, database_url, timeout, keep_running, examples, topic_root, queues)
    try:
        problems = asyncio.run(run_demo(opts, console))
    except KeyboardInterrupt:
        raise CommandFailed("interrupted", code=130) from None
    if problems:
        raise CommandFailed(f"{len(problems)} of the sample jobs did not reach their expected end "
                            f"(log: {log_path})", code=EXIT_UNFINISHED)
    console.print("[green]every sample job reached its expected end[/]")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
