"""Queue views: ``mkctl queues list|show``, ``mkctl workloads pending``, ``mkctl why``.

Each reads the dispatcher's database (``--database-url``, env ``MKD_DATABASE_URL``) through the
query functions of :mod:`dispatcher.queueing.views`, the same functions the HTTP API calls: the
ClusterQueues seen in the records with their pending and admitted counts and the quota in use;
the pending Workloads in admission order with their position in the ClusterQueue and in the
LocalQueue (as Kueue's visibility API gives ``positionInClusterQueue`` / ``positionInLocalQueue``);
and, for one Job, the step that holds it (queue, quota, placement) in words.
``kubectl get clusterqueues`` on the manager shows the status the dispatcher writes there.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dispatcher.queueing import views
from mkctl import output
from mkctl.admin import Output, workloads_app
from mkctl.admin_source import with_session
from mkctl.errors import CommandFailed
from mkctl.output import Column, OutputFormat
from mkctl.services import DatabaseUrl, database_url_from

queues_app = typer.Typer(help="ClusterQueues as the dispatcher records them: pending, admitted, quota in use.",
                         no_args_is_help=True)

QUEUE_COLUMNS = (Column("clusterqueue", "name"), Column("pending", "pending"), Column("admitted", "admitted"),
                 Column("usage", "usage_text"))
PENDING_COLUMNS = (
    Column("clusterqueue", "cluster_queue_text"), Column("pos", "position_in_cluster_queue"),
    Column("namespace", "namespace"), Column("localqueue", "queue"), Column("lq pos", "position_in_local_queue"),
    Column("job", "name"), Column("priority", "priority"), Column("queued", "age"),
    Column("reason", "reason"), Column("kind", "kind", wide=True), Column("uid", "uid", wide=True),
)


def _queue_view(q: dict[str, Any]) -> dict[str, Any]:
    return {**q, "usage_text": ", ".join(f"{k}={v}" for k, v in q["usage"].items()) or "-"}


def _pending_view(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "cluster_queue_text": r["cluster_queue"] or "-", "age": output.age(r["queued_at"])}


@queues_app.command("list")
def queues_list(database_url: DatabaseUrl = None, output_format: Output = OutputFormat.table) -> None:
    """Every ClusterQueue with pending or admitted Workloads: counts and the quota they hold."""
    rows = with_session(database_url_from(database_url), views.queues_from_db)
    typer.echo(output.render([_queue_view(q) for q in rows], QUEUE_COLUMNS, output_format, kind="ClusterQueueList"))


@queues_app.command("show")
def queues_show(name: Annotated[str, typer.Argument(help="ClusterQueue name.")], database_url: DatabaseUrl = None,
                output_format: Output = OutputFormat.table) -> None:
    """One ClusterQueue: counts, quota in use, and its pending Workloads in admission order."""
    url = database_url_from(database_url)
    found = [q for q in with_session(url, views.queues_from_db) if q["name"] == name]
    if not found:
        raise CommandFailed(f"clusterqueue: no Workload was ever queued in {name!r}; `mkctl queues list` shows "
                            "the ClusterQueues in use, `kubectl get clusterqueues` the ones defined")
    pending = with_session(url, lambda s: views.pending_from_db(s, cluster_queue=name))
    typer.echo(output.render_one(_queue_view(found[0]), output_format, sections=[
        ("Pending", [_pending_view(r) for r in pending], PENDING_COLUMNS)]))


def workloads_pending(
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
    queue: Annotated[str | None, typer.Option("--queue", help="Only this ClusterQueue.")] = None,
    local_queue: Annotated[str | None, typer.Option(
        "--local-queue", help="Only this LocalQueue: NAMESPACE/NAME.")] = None,
    namespace: Annotated[str | None, typer.Option("-n", "--namespace", help="Only this namespace.")] = None,
) -> None:
    """Pending Workloads in admission order, with their positions in the ClusterQueue and the LocalQueue."""
    ns, lq = None, None
    if local_queue:
        ns, _, lq = local_queue.rpartition("/")
        ns = ns or "default"
    rows = with_session(database_url_from(database_url), lambda s: views.pending_from_db(
        s, cluster_queue=queue, namespace=ns or namespace, local_queue=lq))
    typer.echo(output.render([_pending_view(r) for r in rows], PENDING_COLUMNS, output_format, kind="PendingList"))


def why(job: Annotated[str, typer.Argument(help="NAMESPACE/NAME, NAME (namespace default) or the workload uid.")],
        database_url: DatabaseUrl = None, output_format: Output = OutputFormat.table) -> None:
    """Why a Job is not running: the step that holds it (queue, quota, placement) and what it lacks."""
    ref = job if "/" in job or len(job) >= 32 else f"default/{job}"
    answer = with_session(database_url_from(database_url), lambda s: views.why_from_db(s, ref))
    if answer is None:
        raise CommandFailed(f"job: no workload {job!r} in the dispatcher's database (mkd claims only Jobs whose "
                            "managedBy is kueue.x-k8s.io/multikueue); `mkctl workloads list` shows the known ones")
    if output_format in (OutputFormat.json, OutputFormat.yaml):
        typer.echo(output.render_one(answer, output_format))
        return
    lines = [f"{answer['workload']}: {answer['step']}: {answer['message']}"]
    if "position_in_cluster_queue" in answer:
        lines.append(f"position {answer['position_in_cluster_queue']} in ClusterQueue "
                     f"{answer['cluster_queue'] or '(open mode)'}, {answer['position_in_local_queue']} in "
                     f"LocalQueue {answer['queue']}")
    if answer.get("priority_source"):
        lines.append(f"priority {answer['priority']} from {answer['priority_source']}")
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    app.add_typer(queues_app, name="queues")
    workloads_app.command("pending")(workloads_pending)
    app.command("why")(why)
