"""Admin views and levers: ``mkctl workloads|placements``, ``mkctl clusters``, ``mkctl events``.

Reading: each command reads the dispatcher's database named by ``--database-url`` (env
``MKD_DATABASE_URL``, else the dispatcher's default) or, given ``--server`` (env ``MKD_SERVER``), the
dispatcher's HTTP API with ``--token`` (env ``MKD_TOKEN``); see :mod:`mkctl.admin_source`. Output is
``-o table|wide|json|yaml``. Lists are in creation order and take ``--kind``, ``--queue``, ``--label``,
``--state`` (checked against the one vocabulary of Workload states, any case) and ``-w`` (print the
list, then one line per change). A cluster's health column is computed from its last heartbeat:
``online``, ``stale`` (no heartbeat for three intervals) or ``offline``; ``cordoned`` when an admin
cordoned it. Actions (``clusters cordon|uncordon|drain``, ``workloads requeue|evict|pin``) go
through the API only: the dispatcher decides, mkctl asks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from federation.errors import Invalid
from mkctl import output
from mkctl.admin_source import ApiSource, DatabaseSource, Source, as_dict, with_session
from mkctl.errors import CommandFailed
from mkctl.output import Column, OutputFormat
from mkctl.services import DatabaseUrl, database_url_from

Output = Annotated[OutputFormat, typer.Option("-o", "--output", help="table, wide, json or yaml.",
                                              case_sensitive=False)]
Server = Annotated[str | None, typer.Option(
    "--server", envvar="MKD_SERVER", show_default=False,
    help="The dispatcher's API (http://host:port); without it mkctl reads the database directly.")]
Token = Annotated[str | None, typer.Option(
    "--token", envvar="MKD_TOKEN", show_default=False,
    help="Bearer token for --server (a manager-cluster token RBAC allows, or the demo's static token).")]
Watch = Annotated[bool, typer.Option("-w", "--watch", help="After the list, print one line per change (Ctrl-C stops).")]
WatchFor = Annotated[float, typer.Option("--watch-for", hidden=True, help="Stop watching after this many seconds.")]
Kubeconfig = Annotated[str | None, typer.Option(
    "--kubeconfig", envvar="KUBECONFIG", show_default=False,
    help="Manager cluster kubeconfig: lets `show` say who manages a Job mkd never claimed.")]

WATCH_POLL_SECONDS = 1.0

PLACEMENT_COLUMNS = (
    Column("namespace", "namespace"),
    Column("job", "name"),
    Column("kind", "kind"),
    Column("queue", "queue"),
    Column("cluster", "cluster"),
    Column("state", "state"),
    Column("reason", "reason"),
    Column("attempt", "attempt", wide=True),
    Column("epoch", "epoch", wide=True),
    Column("pinned", "pinned", wide=True),
    Column("uid", "uid", wide=True),
    Column("age", "created_at"),
)
CLUSTER_COLUMNS = (
    Column("cluster", "name"),
    Column("health", "health"),
    Column("heartbeat", "last_heartbeat"),
    Column("running", "running"),
    Column("cpu free", "cpu_free"),
    Column("gpu free", "gpu_free"),
    Column("agent", "agent_version", wide=True),
    Column("labels", "labels", wide=True),
    Column("kinds", "kinds", wide=True),
)
PLACEMENT_HISTORY_COLUMNS = (
    Column("attempt", "attempt"), Column("cluster", "cluster"), Column("epoch", "epoch"),
    Column("state", "state"), Column("reason", "reason"), Column("created", "created_at"),
    Column("accepted", "accepted_at", wide=True), Column("finished", "finished_at", wide=True),
)
CONDITION_COLUMNS = (
    Column("type", "type"), Column("status", "status"), Column("reason", "reason"), Column("message", "message"),
    Column("changed", "lastTransitionTime"),
)
EVENT_COLUMNS = (
    Column("at", "at"), Column("type", "type"), Column("cluster", "cluster"), Column("reason", "reason"),
    Column("message", "message"),
)
ALL_EVENT_COLUMNS = (
    Column("at", "at"), Column("namespace", "namespace"), Column("job", "name"), Column("type", "type"),
    Column("cluster", "cluster"), Column("reason", "reason"), Column("message", "message"),
    Column("kind", "kind", wide=True), Column("id", "id", wide=True),
)


def cluster_view(item: Mapping[str, Any]) -> dict[str, Any]:
    """A cluster of the read model plus the table's columns: health with cordon, free cpu and GPUs."""
    view = dict(item)
    health = str(item.get("health") or "offline")
    view["health"] = f"{health},cordoned" if item.get("cordoned") else health
    if item.get("refused"):  # a sender with no registered key (mkctl clusters refused), never a cluster
        view["health"] = f"refused ({item['refused']})"
    free = item.get("free") or {}
    view["cpu_free"] = free.get("cpu")
    view["gpu_free"] = free.get("nvidia.com/gpu")
    return view


def placement_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """One workload with its newest placement, spelled with the glossary's words."""
    view = dict(row)
    if "uid" not in view and "workload_uid" in view:
        view["uid"] = view["workload_uid"]
    return view


def source(database_url: str | None, server: str | None, token: str | None,
           kubeconfig: str | None = None) -> Source:
    if server:
        return ApiSource(server, token)
    return DatabaseSource(database_url_from(database_url), kubeconfig)


def workload_filter(*, namespace: str | None = None, kind: str | None = None, queue: str | None = None,
                    cluster: str | None = None, state: str | None = None, label: str | None = None) -> Any:
    from dispatcher.db import admin as dbadmin
    from federation.kinds import registry
    from federation.settings import declared_kinds

    # the dispatcher's declared kinds too, found as its database is (MKD_DISPATCHER_KINDS_FILE)
    declared = os.environ.get("MKD_DISPATCHER_KINDS_FILE")
    with registry.declared(declared_kinds(Path(declared)) if declared else ()):
        parsed = dbadmin.parse_kind(kind)
    return dbadmin.WorkloadFilter(namespace=namespace, kind=parsed, queue=queue, cluster=cluster,
                                  state=dbadmin.parse_state(state), labels=dbadmin.parse_labels(label))


# --- watching -----------------------------------------------------------------------------------


def _stop_at(watch_for: float) -> float:
    return time.monotonic() + watch_for if watch_for > 0 else float("inf")


def _change_line(view: Mapping[str, Any], columns: Sequence[Column], fmt: OutputFormat) -> str:
    if fmt in (OutputFormat.json, OutputFormat.yaml):
        return json.dumps(output.to_jsonable(dict(view)))
    return output.table([view], columns, wide=fmt is OutputFormat.wide).splitlines()[1]


def watch_rows(fetch: Callable[[], list[dict[str, Any]]], key: Callable[[Mapping[str, Any]], Any],
               seen: dict[Any, Any], columns: Sequence[Column], fmt: OutputFormat, watch_for: float) -> None:
    """Poll ``fetch`` and print a line for each row that is new or whose shown fields changed."""
    stop = _stop_at(watch_for)
    try:
        while time.monotonic() < stop:
            time.sleep(min(WATCH_POLL_SECONDS, max(0.0, stop - time.monotonic())))
            for view in fetch():
                shown = tuple(output.cell(view.get(c.key)) for c in columns if c.key not in ("created_at", "at"))
                if seen.get(key(view)) != shown:
                    seen[key(view)] = shown
                    typer.echo(_change_line(view, columns, fmt))
    except KeyboardInterrupt:
        return


# --- commands -----------------------------------------------------------------------------------

workloads_app = typer.Typer(help="Workloads and their placements: list, show, requeue, evict, pin.",
                            no_args_is_help=True)
placements_app = typer.Typer(help="Workloads and their placements (same as `mkctl workloads`).",
                             no_args_is_help=True)
clusters_app = typer.Typer(help="Worker clusters as their agents' heartbeats describe them; cordon, drain.",
                           no_args_is_help=True)


def list_workloads(
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
    namespace: Annotated[str | None, typer.Option("-n", "--namespace", help="Only this namespace.")] = None,
    state: Annotated[str | None, typer.Option(
        "--state", help="Only workloads in this state: pending, placed, running, suspended, finished, failed, "
        "rejected, deleted (any case).")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Only workloads placed on this cluster.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Only this job kind (PyTorchJob, JobSet, ...).")] = None,
    queue: Annotated[str | None, typer.Option("--queue", help="Only this LocalQueue (kueue.x-k8s.io/queue-name), in any namespace unless -n.")] = None,
    label: Annotated[str | None, typer.Option("-l", "--label", help="Only Jobs with these labels: key=value[,...].")
                     ] = None,
    watch: Watch = False,
    watch_for: WatchFor = 0.0,
    server: Server = None,
    token: Token = None,
) -> None:
    """List workloads with their current placement, oldest first: job, kind, queue, cluster, state, reason."""
    f = workload_filter(namespace=namespace, kind=kind, queue=queue, cluster=cluster, state=state, label=label)
    src = source(database_url, server, token)

    def fetch() -> list[dict[str, Any]]:
        return [placement_view(r) for r in src.workloads(f)]

    views = fetch()
    typer.echo(output.render(views, PLACEMENT_COLUMNS, output_format, kind="PlacementList"))
    if watch:
        seen = {v["uid"]: tuple(output.cell(v.get(c.key)) for c in PLACEMENT_COLUMNS if c.key != "created_at")
                for v in views}
        watch_rows(fetch, lambda v: v["uid"], seen, PLACEMENT_COLUMNS, output_format, watch_for)


def show_workload(
    job: Annotated[str, typer.Argument(help="NAMESPACE/NAME, NAME (namespace default) or the workload uid.")],
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
    server: Server = None,
    token: Token = None,
    kubeconfig: Kubeconfig = None,
) -> None:
    """Show one workload: its spec summary, every placement attempt and its history of events."""
    src = source(database_url, server, token, kubeconfig)
    whole = src.workload(job)
    if not whole:
        namespace, _, name = job.rpartition("/")
        why = src.unclaimed(namespace or "default", name)
        if why:  # the Job exists and another controller runs it: that is the answer, not an error
            if output_format in (OutputFormat.json, OutputFormat.yaml):
                typer.echo(output.render_one({"job": f"{namespace or 'default'}/{name}", "managed": False,
                                              "message": why}, output_format))
            else:
                typer.echo(why)
            return
        hint = ("" if server or kubeconfig else
                "; pass --kubeconfig (the manager cluster) or --server to see who manages a Job mkd never claimed")
        raise CommandFailed(f"job: no workload {job!r} in the dispatcher's database (mkd claims only Jobs whose "
                            f"managedBy is kueue.x-k8s.io/multikueue); `mkctl workloads list` shows the known "
                            f"ones{hint}")
    if output_format in (OutputFormat.json, OutputFormat.yaml):
        typer.echo(output.render_one(whole, output_format))
        return
    answer = whole.get("why") or {}
    conditions = whole.get("conditions")
    shown = {k: v for k, v in whole.items() if k not in ("why", "conditions", "podsets")}
    shown["why"] = f"{answer.get('step')}: {answer.get('answer')}" if answer else None
    if conditions is None:
        shown["conditions"] = "unknown: pass --kubeconfig (the manager cluster) or --server to read the Job's own"
    history = [dict(p) for p in whole.get("placements", [])]
    events = [dict(e) for e in whole.get("events", [])]
    sections = [("Placements", history, PLACEMENT_HISTORY_COLUMNS), ("Events", events, EVENT_COLUMNS)]
    if conditions is not None:
        sections.insert(0, ("Conditions", [dict(c) for c in conditions], CONDITION_COLUMNS))
    typer.echo(output.render_one(shown, output_format, sections=sections))


for _app in (workloads_app, placements_app):
    _app.command("list")(list_workloads)
    _app.command("show")(show_workload)


def _act(server: str | None, token: str | None, path: str, body: Mapping[str, Any] | None = None) -> None:
    result = source(None, server, token).action(path, body)
    typer.echo(str(result.get("message") or result))


def _ref_path(job: str) -> str:
    namespace, _, name = job.rpartition("/")
    if not name:
        raise Invalid("job", f"{job!r} names no Job", fix="write NAMESPACE/NAME or NAME (namespace default)")
    return f"/workloads/{namespace or 'default'}/{name}"


@workloads_app.command("requeue")
def workloads_requeue(
    job: Annotated[str, typer.Argument(help="NAMESPACE/NAME or NAME (namespace default).")],
    server: Server = None, token: Token = None,
) -> None:
    """Take a Workload off its cluster (the worker copy is deleted) and place it again."""
    _act(server, token, _ref_path(job) + "/requeue")


@workloads_app.command("evict")
def workloads_evict(
    job: Annotated[str, typer.Argument(help="NAMESPACE/NAME or NAME (namespace default).")],
    server: Server = None, token: Token = None,
) -> None:
    """Take a Workload off its cluster and never place it there again: it is placed on another cluster at once
    (or waits, pending, until one has room). `mkctl workloads show` lists the clusters it is excluded from."""
    _act(server, token, _ref_path(job) + "/evict")


@workloads_app.command("pin")
def workloads_pin(
    job: Annotated[str, typer.Argument(help="NAMESPACE/NAME or NAME (namespace default).")],
    cluster: Annotated[str | None, typer.Argument(help="Cluster to run on; omit with --clear to unpin.")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the pin.")] = False,
    server: Server = None, token: Token = None,
) -> None:
    """Pin a Workload to one cluster (it moves there when it is next placed; requeue to move it now)."""
    if not cluster and not clear:
        raise Invalid("cluster", "missing", fix="name the cluster to pin to, or pass --clear to unpin")
    _act(server, token, _ref_path(job) + "/pin", {"cluster": None if clear else cluster})


@clusters_app.command("list")
def clusters_list(
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
    server: Server = None,
    token: Token = None,
) -> None:
    """List worker clusters: health from the last heartbeat, cordon, running workloads, free capacity."""
    views = [cluster_view(r) for r in source(database_url, server, token).clusters()]
    typer.echo(output.render(views, CLUSTER_COLUMNS, output_format, kind="ClusterList",
                             empty="No clusters have sent a heartbeat yet."))


@clusters_app.command("cordon")
def clusters_cordon(cluster: Annotated[str, typer.Argument(help="Cluster name.")], server: Server = None,
                    token: Token = None) -> None:
    """No new placements on the cluster; what runs there keeps running."""
    _act(server, token, f"/clusters/{cluster}/cordon")


@clusters_app.command("uncordon")
def clusters_uncordon(cluster: Annotated[str, typer.Argument(help="Cluster name.")], server: Server = None,
                      token: Token = None) -> None:
    """Allow placements on the cluster again."""
    _act(server, token, f"/clusters/{cluster}/uncordon")


@clusters_app.command("drain")
def clusters_drain(cluster: Annotated[str, typer.Argument(help="Cluster name.")], server: Server = None,
                   token: Token = None) -> None:
    """Cordon the cluster and move every Workload placed there elsewhere (Delete there, placed again)."""
    _act(server, token, f"/clusters/{cluster}/drain")


def events(
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
    job: Annotated[str | None, typer.Option("--for", help="Only this Workload (NAMESPACE/NAME, NAME or uid).")
                   ] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Only events on this cluster.")] = None,
    type_: Annotated[str | None, typer.Option("--type", help="Only this event type (placed, requeued, ...).")
                     ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many (the newest).")] = 500,
    watch: Watch = False,
    watch_for: WatchFor = 0.0,
    server: Server = None,
    token: Token = None,
) -> None:
    """The history of every Workload and Cluster, oldest first (claimed, placed, requeued, cluster_lost, ...)."""
    if type_:
        from dispatcher.db.models import EVENT_TYPES

        if type_ not in EVENT_TYPES:
            raise Invalid("--type", f"{type_!r} is not an event type", fix=f"use one of: {', '.join(EVENT_TYPES)}")
    src = source(database_url, server, token)
    rows = src.events(ref=job, cluster=cluster, type_=type_, limit=limit)
    typer.echo(output.render(rows, ALL_EVENT_COLUMNS, output_format, kind="EventList", empty="No events."))
    if not watch:
        return
    last = max((int(r["id"]) for r in rows), default=0)
    stop = _stop_at(watch_for)
    try:
        while time.monotonic() < stop:
            time.sleep(min(WATCH_POLL_SECONDS, max(0.0, stop - time.monotonic())))
            for row in src.events(ref=job, cluster=cluster, type_=type_, after_id=last, limit=limit):
                last = max(last, int(row["id"]))
                typer.echo(_change_line(row, ALL_EVENT_COLUMNS, output_format))
    except KeyboardInterrupt:
        return


def register(app: typer.Typer) -> None:
    app.add_typer(workloads_app, name="workloads")
    app.add_typer(placements_app, name="placements")
    app.add_typer(clusters_app, name="clusters")
    app.command("events")(events)


def mkctl_command() -> str:
    """How to run mkctl as the user can type it now: ``mkctl`` when it is on PATH, else its path."""
    import shutil
    import sys
    from pathlib import Path

    on_path = shutil.which("mkctl")
    beside = Path(sys.executable).parent / "mkctl"
    if on_path and (not beside.exists() or Path(on_path).resolve() == beside.resolve()):
        return "mkctl"
    if beside.exists():
        try:
            return str(beside.relative_to(Path.cwd()))
        except ValueError:
            return str(beside)
    return f"{sys.executable} -m mkctl.main"


__all__: Sequence[str] = ("as_dict", "cluster_view", "mkctl_command", "placement_view",
                          "register", "with_session")
