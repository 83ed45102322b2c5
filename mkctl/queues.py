"""Queue views: ``mkctl queues list|show``, ``mkctl workloads pending``, ``mkctl why``.

Each answers from the read model (:mod:`dispatcher.readmodel`), the same functions the HTTP API and the
dashboard call: reading the dispatcher's database (``--database-url``) and, with ``--kubeconfig``, the
manager cluster, or the dispatcher's API (``--server``), with the same columns and values either way.
ClusterQueues are the manager's (every one defined there; without the manager only those Workloads were
recorded in, and the output says so); pending Workloads come in admission order with their position in
the ClusterQueue and in the LocalQueue (as Kueue's visibility API gives ``positionInClusterQueue`` /
``positionInLocalQueue``); ``why`` names the step that holds one Job and what it lacks.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from mkctl import output
from mkctl.admin import Kubeconfig, Output, Server, Token, source, workloads_app
from mkctl.errors import CommandFailed
from mkctl.output import Column, OutputFormat
from mkctl.services import DatabaseUrl

queues_app = typer.Typer(help="ClusterQueues and LocalQueues: quota, usage, pending and admitted Workloads.",
                         no_args_is_help=True)

QUEUE_COLUMNS = (Column("clusterqueue", "name"), Column("cohort", "cohort"), Column("pending", "pending"),
                 Column("admitted", "admitted"), Column("usage", "usage_text"), Column("quota", "quota_text", wide=True))
LOCAL_QUEUE_COLUMNS = (Column("namespace", "namespace"), Column("localqueue", "name"),
                       Column("clusterqueue", "cluster_queue"), Column("pending", "pending"),
                       Column("admitted", "admitted"))
PENDING_COLUMNS = (
    Column("clusterqueue", "cluster_queue_text"), Column("pos", "position_in_cluster_queue"),
    Column("namespace", "namespace"), Column("localqueue", "queue"), Column("lq pos", "position_in_local_queue"),
    Column("job", "name"), Column("priority", "priority"), Column("queued", "queued_at"),
    Column("reason", "reason"), Column("kind", "kind", wide=True), Column("uid", "uid", wide=True),
)
RECORDS_ONLY = ("only the ClusterQueues Workloads were recorded in: pass --kubeconfig (the manager cluster) or "
                "--server to list every one defined")


def _queue_view(q: dict[str, Any]) -> dict[str, Any]:
    return {**q, "usage_text": ", ".join(f"{k}={v}" for k, v in q["usage"].items()) or "-",
            "quota_text": ", ".join(f"{k}={v}" for k, v in q["quota"].items()) or "-"}


def _pending_view(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "cluster_queue_text": r["cluster_queue"] or "-"}


@queues_app.command("list")
def queues_list(database_url: DatabaseUrl = None, output_format: Output = OutputFormat.table,
                server: Server = None, token: Token = None, kubeconfig: Kubeconfig = None) -> None:
    """Every ClusterQueue: cohort, pending and admitted Workloads, the quota they hold."""
    page = source(database_url, server, token, kubeconfig).queues()
    raw = output_format in (OutputFormat.json, OutputFormat.yaml)
    rows = [q if raw else _queue_view(q) for q in page["cluster_queues"]]
    empty = ("No ClusterQueue exists: Workloads are admitted in arrival order without quota (open mode)."
             if page["source"] == "manager" else "No Workload was recorded in a ClusterQueue; " + RECORDS_ONLY + ".")
    typer.echo(output.render(rows, QUEUE_COLUMNS, output_format, kind="ClusterQueueList", empty=empty))
    if rows and page["source"] != "manager" and output_format in (OutputFormat.table, OutputFormat.wide):
        typer.echo(f"({RECORDS_ONLY})")


@queues_app.command("show")
def queues_show(name: Annotated[str, typer.Argument(help="ClusterQueue name.")], database_url: DatabaseUrl = None,
                output_format: Output = OutputFormat.table, server: Server = None, token: Token = None,
                kubeconfig: Kubeconfig = None) -> None:
    """One ClusterQueue: quota, usage, its LocalQueues, and its pending Workloads in admission order."""
    src = source(database_url, server, token, kubeconfig)
    page = src.queues()
    found = [q for q in page["cluster_queues"] if q["name"] == name]
    if not found:
        known = ", ".join(q["name"] for q in page["cluster_queues"]) or "none"
        where = "defined on the manager" if page["source"] == "manager" else RECORDS_ONLY
        raise CommandFailed(f"clusterqueue: no ClusterQueue {name!r} ({where}; known: {known})")
    pending = src.pending(cluster_queue=name)
    local = [q for q in page["local_queues"] if q["cluster_queue"] == name]
    if output_format in (OutputFormat.json, OutputFormat.yaml):
        typer.echo(output.render_one({**found[0], "local_queues": local, "pending_workloads": pending},
                                     output_format))
        return
    q = _queue_view(found[0])
    shown = {"name": q["name"], "cohort": q["cohort"], "quota": q["quota_text"], "usage": q["usage_text"],
             "pending": q["pending"], "admitted": q["admitted"]}
    if q.get("problem"):
        shown["problem"] = q["problem"]
    typer.echo(output.render_one(shown, output_format, sections=[
        ("LocalQueues", local, LOCAL_QUEUE_COLUMNS),
        ("Pending", [_pending_view(r) for r in pending], PENDING_COLUMNS)]))


def workloads_pending(
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
    cluster_queue: Annotated[str | None, typer.Option("--cluster-queue", help="Only this ClusterQueue.")] = None,
    queue: Annotated[str | None, typer.Option(
        "--queue", help="Only this LocalQueue (kueue.x-k8s.io/queue-name), as in `workloads list`.")] = None,
    namespace: Annotated[str | None, typer.Option("-n", "--namespace", help="Only this namespace.")] = None,
    server: Server = None,
    token: Token = None,
) -> None:
    """Pending Workloads in admission order, with their positions in the ClusterQueue and the LocalQueue."""
    rows = source(database_url, server, token).pending(cluster_queue=cluster_queue, namespace=namespace, queue=queue)
    typer.echo(output.render([_pending_view(r) for r in rows], PENDING_COLUMNS, output_format, kind="PendingList",
                             empty="No pending Workloads."))


def why_lines(answer: dict[str, Any]) -> list[str]:
    """``mkctl why``'s text: the step and its answer, the per-cluster figures, the positions, the priority."""
    lines = [f"{answer['workload']}: {answer['step']}: {answer['answer']}"]
    lines += [f"  {d}" for d in answer.get("details") or []]
    if answer.get("position_in_cluster_queue") is not None:
        where = (f"ClusterQueue {answer['cluster_queue']}" if answer.get("cluster_queue")
                 else "arrival order (open mode: no ClusterQueue exists)")
        lines.append(f"position {answer['position_in_cluster_queue']} in {where}, "
                     f"{answer['position_in_local_queue']} in LocalQueue {answer['queue']}")
    if answer.get("priority_source"):
        lines.append(f"priority {answer['priority']} from {answer['priority_source']}")
    return lines


def why(job: Annotated[str, typer.Argument(help="NAMESPACE/NAME, NAME (namespace default) or the workload uid.")],
        database_url: DatabaseUrl = None, output_format: Output = OutputFormat.table, server: Server = None,
        token: Token = None, kubeconfig: Kubeconfig = None) -> None:
    """Why a Job is not running: the step that holds it (queue, quota, placement) and what it lacks."""
    ref = job if "/" in job or len(job) >= 32 else f"default/{job}"
    src = source(database_url, server, token, kubeconfig)
    answer = src.why(ref)
    if answer is None and "/" in ref and not server:
        namespace, _, name = ref.partition("/")
        other = src.unclaimed(namespace, name)
        if other:
            from dispatcher.readmodel import not_managed

            answer = not_managed(ref, other)
    if answer is None:
        hint = "" if server or kubeconfig else "; pass --kubeconfig (the manager cluster) or --server to ask it"
        raise CommandFailed(f"job: no workload {job!r} in the dispatcher's database (mkd claims only Jobs whose "
                            f"managedBy is kueue.x-k8s.io/multikueue); `mkctl workloads list` shows the known ones"
                            f"{hint}")
    if output_format in (OutputFormat.json, OutputFormat.yaml):
        typer.echo(output.render_one(answer, output_format))
        return
    typer.echo("\n".join(why_lines(answer)))


def register(app: typer.Typer) -> None:
    app.add_typer(queues_app, name="queues")
    workloads_app.command("pending")(workloads_pending)
    app.command("why")(why)
