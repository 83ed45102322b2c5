"""Counting from the outside: what the clusters and the database say, never mkd's own counters.

:class:`Observer` watches, through the official Kubernetes client (``federation.kube.Kube``), the jobs of the
mix (PyTorchJobs, RayJobs, AppWrappers, TrainingRuns: a kind from configuration, pod groups, LeaderWorkerSets,
RayServices) on the manager and on
every worker, and the pods on every worker, for the whole run; a pod group is its pods with one
``kueue.x-k8s.io/pod-group-name``, read as one job (``federation.kinds.pod.group_object``) wherever they are. It
keeps, per job: when
it was created, when the manager first showed it Succeeded, and which worker clusters hold a **live** copy
(exists, not Succeeded/Failed, not suspended) or **running** pods right now. The moment a job is live on two
clusters in the watch streams, or in the periodic list of every worker (``sample_seconds``), the overlap is
confirmed with fresh GETs on both clusters; only a confirmed overlap counts as "run twice at once" (watch
streams of different clusters lag each other by milliseconds, so an unconfirmed overlap is reported apart, as
``brief``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.world import KINDS_FILE, MANAGER, NAMESPACE, WORKERS, World
from federation.errors import FederationError, NotFound
from federation.kinds import pod as podkind
from federation.kinds.base import JobKind
from federation.kinds.declared import load
from federation.kinds.registry import KINDS, by_api
from federation.kube import PODS, Kube, Resource

log = logging.getLogger("chaos")

PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
RAYJOBS = Resource("ray.io", "v1", "rayjobs", "RayJob")
APPWRAPPERS = Resource("workload.codeflare.dev", "v1beta2", "appwrappers", "AppWrapper")
TRAININGRUNS = Resource("example.com", "v1", "trainingruns", "TrainingRun")
LEADERWORKERSETS = Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet")
RAYSERVICES = Resource("ray.io", "v1", "rayservices", "RayService")
JOB_RESOURCES = (PYTORCHJOBS, RAYJOBS, APPWRAPPERS, TRAININGRUNS, LEADERWORKERSETS, RAYSERVICES)
"""The kinds of the mix; job names are unique across them."""
SERVING = {"LeaderWorkerSet": "Available", "RayService": "Ready"}
"""Kinds that serve until deleted, never finishing: at their end once this condition of theirs shows True on the
manager (mirrored from the worker that serves them)."""
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
RAY_CLUSTER_LABEL = "ray.io/cluster"
APPWRAPPER_LABEL = "workload.codeflare.dev/appwrapper"
BATCH_JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
GENERIC_OWNER_LABEL = "kubesim.mkd.dev/generic-owner"
"""kubesim's generic operator labels a declared kind's pods with their owner's name."""
DECLARED: dict[tuple[str, str], JobKind] = {(k.api_version, k.name): k for k in load(KINDS_FILE, KINDS)}
"""The mix's kinds from configuration, as the services read them (the observer is no service: it reads them too)."""


def _kind(obj: dict[str, Any]) -> JobKind | None:
    key = (str(obj.get("apiVersion") or ""), str(obj.get("kind") or ""))
    return by_api(*key) or DECLARED.get(key)


def condition(obj: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def outcome(obj: dict[str, Any]) -> str | None:
    """Succeeded / Failed as the job's kind reads its status (None: not finished)."""
    kind = _kind(obj)
    done = kind.finished(obj) if kind is not None else None
    return done.outcome if done is not None else None


def succeeded(obj: dict[str, Any]) -> bool:
    """At its end: Succeeded, or for a serving kind, serving."""
    serving = SERVING.get(str(obj.get("kind") or ""))
    if serving is not None:
        return condition(obj, serving)
    return outcome(obj) == "Succeeded"


def finished(obj: dict[str, Any]) -> bool:
    return outcome(obj) is not None


def suspended(obj: dict[str, Any]) -> bool:
    kind = _kind(obj)
    return kind is not None and kind.is_suspended(obj)


def live_copy(obj: dict[str, Any]) -> bool:
    """A worker copy that can still run: not finished, not suspended, not being deleted."""
    if finished(obj) or (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return not suspended(obj)


def running_pod(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def pod_job(pod: dict[str, Any]) -> str | None:
    """The job a pod runs for: a PyTorchJob's by its label, an AppWrapper's or a LeaderWorkerSet's by their
    controller's label, a RayJob's or a RayService's by its RayCluster (``<job>-xxxxx``) or a RayJob's submitter Job
    (named as the RayJob), a pod group's by its label."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = labels.get(JOB_NAME_LABEL) or labels.get(podkind.GROUP_NAME_LABEL)
    if name:
        return str(name)
    if labels.get(APPWRAPPER_LABEL):
        return str(labels[APPWRAPPER_LABEL])
    if labels.get(GENERIC_OWNER_LABEL):
        return str(labels[GENERIC_OWNER_LABEL])
    if labels.get(LWS_NAME_LABEL):
        return str(labels[LWS_NAME_LABEL])
    cluster = labels.get(RAY_CLUSTER_LABEL)
    if cluster:
        return str(cluster).rsplit("-", 1)[0]
    if labels.get(BATCH_JOB_NAME_LABEL):
        return str(labels[BATCH_JOB_NAME_LABEL])
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "PyTorchJob":
            return str(ref.get("name"))
    return None


def groups_of(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod groups among ``pods``, each as one job (its group object), by group name."""
    members: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        group = podkind.group_name(pod)
        if group is not None:
            members.setdefault(group, []).append(pod)
    return {group: podkind.group_object(found) for group, found in members.items()}


@dataclass
class Track:
    """What the clusters showed about one job."""

    name: str
    created: float | None = None
    done: float | None = None
    live: set[str] = field(default_factory=set)
    """Workers holding a live copy now (watch view)."""
    pods: dict[str, set[str]] = field(default_factory=dict)
    """Worker -> names of running pods now (watch view)."""
    ever: set[str] = field(default_factory=set)
    """Every worker that ever held a copy."""
    finished_on: set[str] = field(default_factory=set)
    """Workers whose copy was seen Succeeded."""
    twice: str = ""
    """Why this job counts as run twice at once (confirmed), or empty."""
    brief: bool = False

    def running_on(self) -> set[str]:
        return {c for c, names in self.pods.items() if names}


@dataclass
class Figures:
    """One scenario's result, from the clusters and the database."""

    scenario: str
    submitted: int
    done: int
    lost: int
    twice: int
    stuck: int
    categories: dict[str, int]
    twice_pods: int
    """Of ``twice``: jobs whose pods were seen Running on two clusters at once (the rest: live copies only)."""
    twice_detail: list[str]
    brief: int
    replaced: int
    """Jobs that had copies on more than one worker over the run (one after the other)."""
    recovery: float | None
    """Seconds from the end of the last fault until every job was Succeeded on the manager (None: not by the deadline)."""
    stalls: list[float]
    """Per fault: seconds from its end until the manager next showed a job Succeeded."""
    faults: list[str]
    wall: float
    crashes: int
    """Services (dispatcher, agents, broker) that exited by themselves and were started again by the runner."""
    notes: list[str]
    examples: dict[str, list[str]]


class Observer:
    """:meth:`Observer.tally` (after the faults) reads the manager afresh, every worker afresh and the
    ``workloads`` table, and sorts every job that is not Succeeded on the manager:

    - ``not claimed``: no workloads row (the dispatcher never took it);
    - ``never mirrored``: a worker copy finished but the manager does not say so;
    - ``nowhere``: the database has it placed or running but no worker holds a copy;
    - ``failed``: the manager shows Failed or MultiClusterRejected (the jobs here always exit 0);
    - ``pending``: the database has it waiting for a placement;
    - ``suspended``: its only copies are suspended (an agent fenced them, and nothing resumed them);
    - ``running``: a worker still runs it.

    **lost** = not claimed + never mirrored + nowhere + failed (nothing will bring these to their end),
    plus any job Succeeded on the manager that no worker ever held (a status nobody earned);
    **stuck** = every job not Succeeded on the manager at the deadline (lost included).
    """
    def __init__(self, world: World, sample_seconds: float = 3.0) -> None:
        self.world = world
        self.sample_seconds = sample_seconds
        self.jobs: dict[str, Track] = {}
        self.kubes: dict[str, Kube] = {}
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._confirming: set[str] = set()
        self.listed: dict[str, asyncio.Event] = {}
        self.samples = 0
        self.completions: list[tuple[float, str]] = []
        self.errors: Counter[str] = Counter()
        self.group_pods: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        """cluster -> pod group -> pod name -> pod, as the watches show them."""

    def track(self, name: str) -> Track:
        t = self.jobs.get(name)
        if t is None:
            t = self.jobs[name] = Track(name)
        return t

    async def __aenter__(self) -> Observer:
        from federation.settings import KubeSettings

        await self._stack.__aenter__()
        settings = KubeSettings(max_concurrency=32)
        for name in (MANAGER, *WORKERS):
            self.kubes[name] = await self._stack.enter_async_context(
                Kube(self.world.kubeconfigs[name], settings=settings))
        streams = [(MANAGER, r) for r in (*JOB_RESOURCES, PODS)] + [(w, r) for w in WORKERS
                                                                      for r in (*JOB_RESOURCES, PODS)]
        for cluster, res in streams:
            ready = self.listed[f"{cluster}/{res.plural}"] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._follow(cluster, res, ready)))
        self._tasks.append(asyncio.create_task(self._sample()))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self.listed.values())), 60)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        await self._stack.__aexit__(None, None, None)

    # --- watching --------------------------------------------------------------------------------
    async def _follow(self, cluster: str, res: Resource, ready: asyncio.Event) -> None:
        # An empty namespace lists nothing, so the first event may never come: ready after a list.
        await self.kubes[cluster].list(res, NAMESPACE)
        ready.set()
        async for event in self.kubes[cluster].informer(res, NAMESPACE):
            try:
                if res is PODS:
                    self._on_group_pod(cluster, event.type, event.object)
                if cluster == MANAGER:
                    if res is not PODS:
                        self._on_manager(event.type, event.object)
                elif res is PODS:
                    self._on_pod(cluster, event.type, event.object)
                else:
                    self._on_copy(cluster, event.type, event.object)
            except Exception as exc:  # a bug here must not stop the watching
                self.errors[f"{type(exc).__name__}: {exc}"] += 1

    def _on_manager(self, kind: str, obj: dict[str, Any]) -> None:
        t = self.track(obj["metadata"]["name"])
        if kind != "DELETED" and t.done is None and succeeded(obj):
            t.done = time.monotonic()
            self.completions.append((t.done, t.name))

    def _on_group_pod(self, cluster: str, kind: str, pod: dict[str, Any]) -> None:
        """A pod of a pod group: its group, read as one job, is what the manager shows done or a worker holds."""
        group = podkind.group_name(pod)
        if group is None:
            return
        found = self.group_pods.setdefault(cluster, {}).setdefault(group, {})
        if kind == "DELETED":
            found.pop(pod["metadata"]["name"], None)
        else:
            found[pod["metadata"]["name"]] = pod
        obj = podkind.group_object(list(found.values())) if found else None
        if cluster == MANAGER:
            t = self.track(group)
            if obj is not None and t.done is None and succeeded(obj):
                t.done = time.monotonic()
                self.completions.append((t.done, t.name))
            return
        self._on_copy(cluster, "DELETED" if obj is None else kind, obj or {"metadata": {"name": group}}, name=group)

    def _on_copy(self, cluster: str, kind: str, obj: dict[str, Any], *, name: str | None = None) -> None:
        t = self.track(name or obj["metadata"]["name"])
        t.ever.add(cluster)
        if kind != "DELETED" and succeeded(obj):
            t.finished_on.add(cluster)
        if kind != "DELETED" and live_copy(obj):
            t.live.add(cluster)
        else:
            t.live.discard(cluster)
        self._check(t)

    def _on_pod(self, cluster: str, kind: str, pod: dict[str, Any]) -> None:
        job = pod_job(pod)
        if job is None:
            return
        t = self.track(job)
        names = t.pods.setdefault(cluster, set())
        if kind != "DELETED" and running_pod(pod):
            names.add(pod["metadata"]["name"])
        else:
            names.discard(pod["metadata"]["name"])
        self._check(t)

    def _check(self, t: Track) -> None:
        if t.twice or t.name in self._confirming:
            return
        if len(t.live) >= 2 or len(t.running_on()) >= 2:
            self._confirming.add(t.name)
            self._tasks.append(asyncio.create_task(self._confirm(t)))

    async def _confirm(self, t: Track) -> None:
        """Fresh GETs on every worker: is the job live (copy) or running (pods) on two at once?"""
        try:
            copies: list[str] = []
            pods: list[str] = []
            for w in WORKERS:
                for res in JOB_RESOURCES:
                    try:
                        obj = await self.kubes[w].get(res, t.name, NAMESPACE)
                        if live_copy(obj):
                            copies.append(w)
                    except NotFound:
                        pass
                listed = await self.kubes[w].list(PODS, NAMESPACE)
                group = groups_of(listed.items).get(t.name)
                if group is not None and live_copy(group):
                    copies.append(w)
                if any(running_pod(p) and pod_job(p) == t.name for p in listed.items):
                    pods.append(w)
            if len(copies) >= 2 or len(pods) >= 2:
                parts = []
                if len(copies) >= 2:
                    parts.append(f"live copies on {', '.join(copies)}")
                if len(pods) >= 2:
                    parts.append(f"running pods on {', '.join(pods)}")
                t.twice = f"{t.name}: " + " and ".join(parts) + f" at {time.strftime('%H:%M:%S')}"
                log.warning("run twice at once: %s", t.twice)
            else:
                t.brief = True
        except FederationError as exc:
            self.errors[f"confirm: {exc}"] += 1
        finally:
            self._confirming.discard(t.name)

    async def _sample(self) -> None:
        """Independent of the watches: list every worker, look for jobs live on two."""
        while True:
            await asyncio.sleep(self.sample_seconds)
            try:
                lists = await asyncio.gather(*(self.kubes[w].list(res, NAMESPACE) for w in WORKERS
                                               for res in (*JOB_RESOURCES, PODS)))
            except FederationError as exc:
                self.errors[f"sample: {exc}"] += 1
                continue
            self.samples += 1
            where: dict[str, list[str]] = {}
            owners = [(w, res) for w in WORKERS for res in (*JOB_RESOURCES, PODS)]
            for (w, res), listed in zip(owners, lists, strict=True):
                named = groups_of(listed.items) if res is PODS else {o["metadata"]["name"]: o for o in listed.items}
                for name, obj in named.items():
                    if live_copy(obj):
                        where.setdefault(name, []).append(w)
            for name, clusters in where.items():
                t = self.track(name)
                if len(clusters) >= 2 and not t.twice and name not in self._confirming:
                    self._confirming.add(name)
                    self._tasks.append(asyncio.create_task(self._confirm(t)))

    # --- the end ------------------------------------------------------------------------------------
    def done_count(self, names: list[str]) -> int:
        return sum(1 for n in names if (t := self.jobs.get(n)) is not None and t.done is not None)

    async def wait_done(self, names: list[str], deadline: float, check: Any = None) -> None:
        while time.monotonic() < deadline and self.done_count(names) < len(names):
            if check is not None:
                check()
            await asyncio.sleep(0.5)

    async def tally(self, scenario: str, names: list[str], faults: list[tuple[str, float, float]],
                    started: float, notes: list[str], crashes: int = 0) -> Figures:
        manager = {o["metadata"]["name"]: o for res in JOB_RESOURCES
                   for o in (await self.kubes[MANAGER].list(res, NAMESPACE)).items}
        manager.update(groups_of((await self.kubes[MANAGER].list(PODS, NAMESPACE)).items))
        workers = {w: {o["metadata"]["name"]: o for res in JOB_RESOURCES
                       for o in (await self.kubes[w].list(res, NAMESPACE)).items} for w in WORKERS}
        for w in WORKERS:
            workers[w].update(groups_of((await self.kubes[w].list(PODS, NAMESPACE)).items))
        rows = await self._workload_rows()
        categories: Counter[str] = Counter()
        examples: dict[str, list[str]] = {}
        phantom: list[str] = []
        for name in names:
            obj = manager.get(name)
            t = self.track(name)
            if obj is not None and succeeded(obj):
                if t.done is None:  # the watch missed it; the fresh list is the truth
                    t.done = time.monotonic()
                if not t.ever and not any(name in workers[w] for w in WORKERS):
                    phantom.append(name)  # Succeeded on the manager, yet no worker ever held it
                continue
            copies = {w: workers[w][name] for w in WORKERS if name in workers[w]}
            row = rows.get(obj["metadata"]["uid"]) if obj is not None else None
            if obj is None:
                what = "deleted"
            elif outcome(obj) == "Failed" or condition(obj, "MultiClusterRejected"):
                what = "failed"
            elif row is None:
                what = "not claimed"
            elif any(succeeded(c) for c in copies.values()) or t.finished_on:
                what = "never mirrored"
            elif any(live_copy(c) for c in copies.values()):
                what = "running"
            elif any(suspended(c) for c in copies.values()):
                what = "suspended"  # fenced, or suspended by mkd, and not resumed
            elif str(row.get("state")) == "pending":
                what = "pending"
            else:
                what = "nowhere"
            categories[what] += 1
            ex = examples.setdefault(what, [])
            if len(ex) < 3:
                ex.append(f"{name} (db: {row and {k: row[k] for k in ('state', 'cluster', 'attempt')}}; "
                          f"copies: {sorted(copies)}; seen on: {sorted(t.ever)})")
        lost = sum(categories[c] for c in ("not claimed", "never mirrored", "nowhere", "failed", "deleted"))
        stuck = sum(categories.values())
        if phantom:  # not stuck, but its result is not true: counted lost
            categories["succeeded, never on a worker"] = len(phantom)
            examples["succeeded, never on a worker"] = phantom[:3]
            lost += len(phantom)
        twice = [self.jobs[n].twice for n in names if n in self.jobs and self.jobs[n].twice]
        twice_pods = sum(1 for t in twice if "running pods" in t)
        brief = sum(1 for n in names if n in self.jobs and self.jobs[n].brief and not self.jobs[n].twice)
        replaced = sum(1 for n in names if n in self.jobs and len(self.jobs[n].ever) > 1)
        last_fault = max((end for _, _, end in faults), default=started)
        done_times = [self.jobs[n].done for n in names if n in self.jobs and self.jobs[n].done is not None]
        recovery = (max(done_times) - last_fault if done_times else None) if stuck == 0 else None
        if recovery is not None:
            recovery = max(0.0, recovery)
        stalls = []
        mine = set(names)
        for _, _, end in faults:
            after = [c for c, n in self.completions if c >= end and n in mine]
            if after:
                stalls.append(min(after) - end)
        if self.errors:
            notes = [*notes, "observer errors: " + "; ".join(f"{k} x{v}" for k, v in self.errors.most_common(5))]
        doubled = {n for n in names if n in self.jobs and self.jobs[n].twice}
        if doubled:
            notes = [*notes, await self._why_moved(doubled)]
        return Figures(scenario=scenario, submitted=len(names), done=len(names) - stuck, lost=lost, twice=len(twice),
                       twice_pods=twice_pods, stuck=stuck, categories=dict(categories), twice_detail=twice[:10], brief=brief,
                       replaced=replaced, recovery=recovery, stalls=stalls,
                       faults=[f"{what} at +{start - started:.0f}s ({end - start:.1f}s)" for what, start, end in faults],
                       wall=time.monotonic() - started, crashes=crashes, notes=notes, examples=examples)

    async def _why_moved(self, names: set[str]) -> str:
        """How the dispatcher moved the jobs that ran twice, from its ``placements`` rows: a placement made
        ``lost`` that the worker had accepted (its lease was over) or had not (an unanswered Place)."""
        from sqlalchemy import text

        from dispatcher.db import make_engine

        engine = make_engine(self.world.database_url)
        try:
            async with engine.connect() as conn:
                result = await conn.execute(text(
                    "SELECT w.name, p.accepted_at IS NOT NULL AS accepted FROM placements p JOIN workloads w "
                    "ON w.uid = p.workload_uid WHERE w.namespace = :ns AND p.state = 'lost'"), {"ns": NAMESPACE})
                rows = [(r[0], bool(r[1])) for r in result if r[0] in names]
        except Exception as exc:  # a witness only: the figures stand without it
            return f"run twice: placements not readable ({type(exc).__name__})"
        finally:
            await engine.dispose()
        accepted = {n for n, a in rows if a}
        unanswered = {n for n, a in rows if not a} - accepted
        other = names - accepted - unanswered
        return (f"run twice, how the dispatcher moved them (placements made lost): {len(accepted)} accepted by the "
                f"worker (moved after its lease), {len(unanswered)} never answered (an unanswered Place moved), "
                f"{len(other)} not moved as lost")

    async def _workload_rows(self) -> dict[str, dict[str, Any]]:
        """The dispatcher's database, read with plain SQL (the database is a witness, not mkd's counters)."""
        from sqlalchemy import text

        from dispatcher.db import make_engine

        engine = make_engine(self.world.database_url)
        try:
            for _ in range(30):
                try:
                    async with engine.connect() as conn:
                        result = await conn.execute(text(
                            "SELECT uid, name, state, cluster, attempt FROM workloads WHERE namespace = :ns"),
                            {"ns": NAMESPACE})
                        return {r[0]: dict(r._mapping) for r in result}
                except Exception as exc:  # the database may still be recovering
                    last = exc
                    await asyncio.sleep(1)
            raise RuntimeError(f"cannot read the workloads table: {last}")
        finally:
            await engine.dispose()
