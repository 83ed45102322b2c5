"""The agent's answers to the dispatcher's Asks: a placed Job's pods (with their Events) and a container's log.

An Ask names a placement; the agent answers only about the copy it runs for it (the worker Job whose
workload-uid and attempt labels match), so no Ask reaches pods of anything else. The copy's pods are found by
ownership (pods owned by the copy, or by a batch Job, JobSet or RayCluster it owns, as the kinds' controllers
make them),
each with its role and index from the labels the controllers set. A log is read through the worker's API
(``GET pods/{name}/log``, the agent's one extra permission) and sent in frames of at most
``podstream.MAX_DATA`` bytes on the cluster's streams topic, over a connection of its own so that Reports never
queue behind log bytes. Limits: streams at once (``max_streams``), bytes per second per stream (the lower of
the Ask's and ``max_rate``), and a follow ends after ``idle_seconds`` without a byte, when the container ends,
or when the dispatcher says ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from federation import labels, topics
from federation.clock import Clock
from federation.errors import FederationError, Invalid, NotFound, Transport
from federation.kinds import registry
from federation.kinds.raycluster import RAYCLUSTER
from federation.kube import EVENTS, JOBS, PODS, Kube, Resource, resource_for
from federation.messages import Ask
from federation.mqtt import LinkHealth, MqttLink
from federation.podstream import MAX_DATA, Frame, FrameSealer
from federation.sealing import recipients
from federation.tasks import TaskSet
from worker_agent.identity import AgentIdentity
from worker_agent.settings import AgentSettings

log = logging.getLogger(__name__)

JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
RAYCLUSTERS = resource_for(RAYCLUSTER)
LEAD_ROLES = ("submitter", "master", "launcher", "head", "leader", "chief", "driver", "coordinator")
"""Roles whose first pod is the one a log is read from by default, in this order (then any role, index 0): a
RayJob's submitter prints the Ray job's log."""
LINK_WAIT = 10.0
"""Seconds an answer waits for the streams connection before it gives up."""
RAY_NODE_TYPE, RAY_GROUP, RAY_ORIGIN = "ray.io/node-type", "ray.io/group", "ray.io/originated-from-crd"
LWS_WORKER_INDEX, LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/worker-index", "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def pod_role(pod: Mapping[str, Any]) -> tuple[str, int]:
    """A pod's role (its PodSet) and index, from the labels its controller sets.

    KubeRay's pods: ``head``, or their worker group's name lower-cased (Kueue's PodSet names; KubeRay numbers no
    pod, so each has index 0), and a RayJob's submitter; LWS's: ``leader`` (index: the group) and ``worker``
    (numbered across the groups)."""
    meta = pod.get("metadata") or {}
    lab = meta.get("labels") or {}
    ray_type = lab.get(RAY_NODE_TYPE)
    if ray_type:
        return ("head" if ray_type == "head" else str(lab.get(RAY_GROUP) or "worker").lower()), 0
    if lab.get(RAY_ORIGIN) == "RayJob":  # the submitter Job's pod (its template carries the label)
        return "submitter", _int(lab.get("batch.kubernetes.io/job-completion-index"))
    worker = lab.get(LWS_WORKER_INDEX)
    if worker is not None:
        group, index = _int(lab.get(LWS_GROUP_INDEX)), _int(worker)
        if index == 0:
            return "leader", group
        size = _int((meta.get("annotations") or {}).get(LWS_SIZE), 2)
        return "worker", group * max(size - 1, 1) + index - 1
    role = (lab.get("training.kubeflow.org/replica-type") or lab.get("training.kubeflow.org/job-role")
            or lab.get("jobset.sigs.k8s.io/replicatedjob-name") or "main")
    raw = (lab.get("training.kubeflow.org/replica-index") or lab.get("batch.kubernetes.io/job-completion-index"))
    job_index = lab.get("jobset.sigs.k8s.io/job-index")
    if job_index not in (None, "0") and not lab.get("training.kubeflow.org/replica-index"):
        raw = job_index
    return str(role).lower(), _int(raw)


def lead_order(pod: Mapping[str, Any]) -> tuple[int, str, int, str]:
    role, index = pod_role(pod)
    rank = LEAD_ROLES.index(role) if role in LEAD_ROLES else len(LEAD_ROLES)
    return rank, role, index, str((pod.get("metadata") or {}).get("name"))


def pod_summary(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What ``mkctl pods`` shows of one pod: role, index, phase, ready, restarts, node, age and why it waits or
    why it last ended."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    role, index = pod_role(pod)
    statuses = list(status.get("containerStatuses") or ())
    reason = message = ""
    for cs in list(status.get("initContainerStatuses") or ()) + statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in ("PodInitializing", "ContainerCreating"):
            reason, message = str(waiting["reason"]), str(waiting.get("message") or "")
            break
    if not reason:
        for cs in statuses:
            ended = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if ended and ended.get("reason") not in (None, "Completed"):
                reason = str(ended.get("reason"))
                message = str(ended.get("message") or f"exit code {ended.get('exitCode')}")
                break
    if not reason:
        for cond in status.get("conditions") or ():
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                reason, message = str(cond.get("reason") or "Unschedulable"), str(cond.get("message") or "")
    return {
        "name": meta.get("name"), "role": role, "index": index, "phase": status.get("phase") or "Pending",
        "ready": f"{sum(1 for cs in statuses if cs.get('ready'))}/{len(spec.get('containers') or ())}",
        "restarts": sum(int(cs.get("restartCount") or 0) for cs in statuses), "node": spec.get("nodeName") or "",
        "created": meta.get("creationTimestamp") or "", "reason": reason, "message": message,
        "containers": [c.get("name") for c in spec.get("containers") or ()],
        "init_containers": [c.get("name") for c in spec.get("initContainers") or ()],
        "deleting": bool(meta.get("deletionTimestamp")),
    }


def event_summary(event: Mapping[str, Any]) -> dict[str, Any]:
    involved = event.get("involvedObject") or {}
    return {"object": f"{involved.get('kind')}/{involved.get('name')}", "type": event.get("type") or "",
            "reason": event.get("reason") or "", "message": event.get("message") or "",
            "count": int(event.get("count") or 1),
            "last": event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or ""}


class AskRefused(Exception):
    """An Ask the agent cannot answer: ``reason`` for the program, ``message`` for the user."""

    def __init__(self, reason: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.fields = fields


class Answerer:
    """Answers Asks for one cluster; ``run_link`` keeps the streams connection up (a supervised task)."""

    def __init__(self, settings: AgentSettings, kube: Kube, identity: AgentIdentity, clock: Clock) -> None:
        self.settings = settings
        self.kube = kube
        self.clock = clock
        self.cluster = settings.cluster_name
        self.topic = topics.streams(settings.cluster_name, settings.mqtt.topic_root)
        self.frames = FrameSealer(identity.sealer, recipients(identity.dispatcher_keys))
        self.max_streams = settings.max_log_streams
        self.max_rate = settings.max_log_rate
        self.active: dict[str, asyncio.Task[None]] = {}
        self.tasks: TaskSet | None = None
        self.link: MqttLink | None = None
        self._linked = asyncio.Event()
        self.bytes_sent = 0
        self.namespace_of: Callable[[str], str] = lambda namespace: namespace
        """The worker namespace a manager namespace maps to (the policy's, as the inbox maps Places)."""

    # --- the connection ---------------------------------------------------------------------
    async def run_link(self) -> None:
        health = LinkHealth(self.settings.mqtt, self.clock)
        while True:
            try:
                async with MqttLink(self.settings.mqtt, client_id=f"{self.settings.client_id()}-streams"[:200],
                                    persistent=False) as link:
                    self.link = link
                    self._linked.set()
                    health.connected_now()
                    async for _ in link.messages():  # nothing is subscribed: this waits for the link to drop
                        pass
            except Transport as exc:
                health.failed(exc)
                log.warning("streams link lost (%s); retrying in %.1fs", exc, health.next_delay())
            finally:
                self.link = None
                self._linked.clear()
            await self.clock.sleep(health.next_delay())

    async def _publish(self, frame: Frame) -> None:
        if self.link is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._linked.wait(), LINK_WAIT)
        link = self.link
        if link is None:
            raise Transport("the streams connection to the broker is down")
        await link.publish(self.topic, self.frames.seal(self.topic, frame))

    # --- asks ---------------------------------------------------------------------------------
    def ask(self, cmd: Ask) -> None:
        if cmd.what == "stop":
            task = self.active.get(cmd.id)
            if task is not None:
                task.cancel()
            return
        if cmd.id in self.active:
            return  # a repeat of an Ask being answered
        coro = self._answer(cmd)
        if self.tasks is not None:
            task = self.tasks.spawn(coro, name=f"ask/{cmd.id}")
        else:
            task = asyncio.get_running_loop().create_task(coro, name=f"ask/{cmd.id}")
        self.active[cmd.id] = task
        ident = cmd.id

        def done(_task: asyncio.Task[None]) -> None:
            self.active.pop(ident, None)

        task.add_done_callback(done)

    async def _answer(self, cmd: Ask) -> None:
        seq = 0

        async def send(kind: Any, data: bytes = b"", **fields: Any) -> None:
            nonlocal seq
            seq += 1
            await self._publish(Frame(cmd.id, seq, kind, fields, data))

        try:
            if len(self.active) > self.max_streams:
                raise AskRefused("busy", f"cluster {self.cluster} already serves {self.max_streams} log streams "
                                         "(its agent's max_log_streams); try again when one ends")
            copy = await self._copy(cmd)
            pods, owners = await self._pods(copy)
            namespace = str(copy["metadata"]["namespace"])
            if cmd.what == "pods":
                events = await self._events(namespace, owners | {str(p["metadata"].get("uid")) for p in pods})
                await send("pods", pods=[pod_summary(p) for p in pods], events=events)
                return
            pod, container = self._choose(cmd, pods)
            reason = await self._stream(cmd, namespace, pod, container, send)
            await send("end", reason=reason)
        except AskRefused as exc:
            with contextlib.suppress(FederationError):
                await send("error", reason=exc.reason, message=exc.message, **exc.fields)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(send("end", reason="stopped"), 2.0)
            raise
        except FederationError as exc:
            log.info("ask %s on %s/%s: %s", cmd.id, cmd.job.namespace, cmd.job.name, exc)
            with contextlib.suppress(FederationError):
                await send("error", reason="worker_api", message=str(exc))

    async def _copy(self, cmd: Ask) -> dict[str, Any]:
        kind = next((k for k in registry.kinds() if k.name == cmd.job.kind), None)
        if kind is None:
            raise AskRefused("unknown_kind", f"this agent does not know the kind {cmd.job.kind}")
        try:
            copy = await self.kube.get(resource_for(kind), cmd.job.name, self.namespace_of(cmd.job.namespace))
        except NotFound:
            raise AskRefused("no_copy", f"cluster {self.cluster} has no copy of {cmd.job.namespace}/{cmd.job.name} "
                                        "(deleted there, or it moved to another cluster)") from None
        lab = (copy.get("metadata") or {}).get("labels") or {}
        if (lab.get(labels.WORKLOAD_UID) != cmd.placement.workload_uid
                or lab.get(labels.PLACEMENT_ATTEMPT) != str(cmd.placement.attempt)):
            raise AskRefused("no_copy", f"the copy of {cmd.job.namespace}/{cmd.job.name} on cluster {self.cluster} "
                                        f"is not attempt {cmd.placement.attempt} of this Workload")
        return copy

    async def _pods(self, copy: Mapping[str, Any]) -> tuple[list[dict[str, Any]], set[str]]:
        """The copy's pods (owned by it or by a batch Job, JobSet or RayCluster it owns, at any depth: a RayJob's
        and a RayService's Ray pods are their RayCluster's; a placed Pod is one itself) and the owners' uids."""
        ns = str((copy.get("metadata") or {}).get("namespace"))
        owners = {str((copy.get("metadata") or {}).get("uid"))}
        middles: list[dict[str, Any]] = []
        for res in (JOBSETS, JOBS, RAYCLUSTERS):
            try:
                middles += (await self.kube.list(res, ns)).items
            except (NotFound, Invalid):
                continue  # the JobSet or RayCluster CRD is not installed
        grew = True
        while grew:
            grew = False
            for obj in middles:
                uid = str(obj["metadata"].get("uid"))
                if uid not in owners and _owned_by(obj, owners):
                    owners.add(uid)
                    grew = True
        copy_uid = str((copy.get("metadata") or {}).get("uid"))
        # a single Pod's copy is the pod itself, a group's lead pod one of the group's pods
        pods = [p for p in (await self.kube.list(PODS, ns)).items
                if _owned_by(p, owners) or str(p["metadata"].get("uid")) == copy_uid]
        pods.sort(key=lead_order)
        return pods, owners

    async def _events(self, namespace: str, uids: set[str]) -> list[dict[str, Any]]:
        try:
            items = (await self.kube.list(EVENTS, namespace)).items
        except FederationError as exc:
            log.info("events of %s not listed: %s", namespace, exc)
            return []
        chosen = [e for e in items if str((e.get("involvedObject") or {}).get("uid")) in uids]
        chosen.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return [event_summary(e) for e in chosen[-200:]]

    def _choose(self, cmd: Ask, pods: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
        names = [str(p["metadata"]["name"]) for p in pods]
        if not pods:
            raise AskRefused("no_pods", f"the copy on cluster {self.cluster} has no pods yet (they are being "
                                        "created, or the Job has not started)", pods=[])
        if cmd.pod:
            pod = next((p for p in pods if p["metadata"]["name"] == cmd.pod), None)
            if pod is None:
                raise AskRefused("pod_not_found", f"no pod {cmd.pod} in this Job; its pods: {', '.join(names)}",
                                 pods=names)
        elif cmd.role or cmd.index is not None:
            fits = [p for p in pods if (not cmd.role or pod_role(p)[0] == cmd.role.lower())
                    and (cmd.index is None or pod_role(p)[1] == cmd.index)]
            if not fits:
                have = ", ".join(f"{n} ({r} {i})" for n, (r, i) in zip(names, map(pod_role, pods), strict=True))
                wanted = " ".join(x for x in (cmd.role, "" if cmd.index is None else f"index {cmd.index}") if x)
                raise AskRefused("pod_not_found", f"no pod of {wanted} in this Job; its pods: {have}", pods=names)
            pod = fits[0]
        else:
            pod = pods[0]
        spec = pod.get("spec") or {}
        containers = [str(c.get("name")) for c in spec.get("containers") or ()]
        inits = [str(c.get("name")) for c in spec.get("initContainers") or ()]
        if cmd.container:
            if cmd.container not in containers + inits:
                extra = f" (init: {', '.join(inits)})" if inits else ""
                raise AskRefused("container_not_found", f"pod {pod['metadata']['name']} has no container "
                                                        f"{cmd.container}; its containers: {', '.join(containers)}"
                                                        f"{extra}", containers=containers + inits)
            return pod, cmd.container
        default = ((pod.get("metadata") or {}).get("annotations") or {}).get("kubectl.kubernetes.io/default-container")
        return pod, default if default in containers else containers[0]

    async def _ended(self, namespace: str, pod: str, container: str) -> str:
        return await _container_ended(self.kube, namespace, pod, container)

    async def _stream(self, cmd: Ask, namespace: str, pod: Mapping[str, Any], container: str, send: Any) -> str:
        query = [("container", container)]
        for key, value in (("previous", cmd.previous), ("timestamps", cmd.timestamps), ("follow", cmd.follow)):
            if value:
                query.append((key, "true"))
        for key, number in (("tailLines", cmd.tail_lines), ("sinceSeconds", cmd.since_seconds),
                            ("limitBytes", cmd.limit_bytes)):
            if number is not None:
                query.append((key, str(number)))
        rate = float(min(cmd.rate, self.max_rate))
        name = str(pod["metadata"]["name"])
        began, sent = time.monotonic(), 0
        reader = aiter(self.kube.pod_log(namespace, name, query))
        header = False
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(anext(reader), cmd.idle_seconds)
                except StopAsyncIteration:
                    chunk, reason = b"", "completed" if not cmd.follow else await self._ended(namespace, name,
                                                                                               container)
                except TimeoutError:
                    chunk, reason = b"", "idle"
                else:
                    reason = ""
                if not header:  # the first frame names the pod and container, once the worker's API said yes
                    await send("data", pod=name, container=container)
                    header = True
                if reason:
                    return reason
                for at in range(0, len(chunk), MAX_DATA):
                    part = chunk[at:at + MAX_DATA]
                    ahead = (sent + len(part)) / rate - (time.monotonic() - began)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                    await send("data", part)
                    sent += len(part)
                    self.bytes_sent += len(part)
        except Invalid as exc:
            raise AskRefused("refused", exc.detail) from None
        except NotFound:
            raise AskRefused("pod_gone", f"pod {name} is gone from cluster {self.cluster} (deleted, or its Job "
                                         "was cleaned up): its log went with it") from None
        finally:
            close = getattr(reader, "aclose", None)
            if close is not None:
                await close()


async def _container_ended(kube: Kube, namespace: str, pod: str, container: str) -> str:
    """Why a followed log ended: ``completed`` (its container did), ``pod_gone`` (the pod was deleted) or
    ``stopped`` (the connection closed while the container runs)."""
    try:
        got = await kube.get(PODS, pod, namespace)
    except NotFound:
        return "pod_gone"
    except FederationError:
        return "stopped"
    if (got.get("metadata") or {}).get("deletionTimestamp"):
        return "pod_gone"
    status = got.get("status") or {}
    for cs in list(status.get("containerStatuses") or ()) + list(status.get("initContainerStatuses") or ()):
        if cs.get("name") == container:
            return "stopped" if "running" in (cs.get("state") or {}) else "completed"
    return "completed"


def _owned_by(obj: Mapping[str, Any], owners: set[str]) -> bool:
    return any(str(ref.get("uid")) in owners for ref in (obj.get("metadata") or {}).get("ownerReferences") or ())
