"""Admin views of the dispatcher's database: ``mkctl placements list|show`` and ``mkctl clusters list``.

Read-only: each command opens the database named by ``--database-url`` (env ``MKD_DATABASE_URL``,
else the dispatcher's default), runs one of the dispatcher's query functions in one session, and
prints the rows with ``-o table|wide|json|yaml``. A cluster's health column is computed here from
its last heartbeat: ``online``, ``stale`` (no heartbeat for three intervals: the agent may be gone
without its will being delivered yet) or ``offline`` (will received, or never heard of).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from mkctl import output
from mkctl.errors import CommandFailed
from mkctl.output import Column, OutputFormat
from mkctl.services import DatabaseUrl, await_maybe, database_url_from

Output = Annotated[OutputFormat, typer.Option("-o", "--output", help="table, wide, json or yaml.",
                                              case_sensitive=False)]

STALE_INTERVALS = 3.0
"""A cluster whose last heartbeat is older than this many heartbeat intervals shows as stale."""

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
EVENT_COLUMNS = (
    Column("at", "at"), Column("type", "type"), Column("cluster", "cluster"), Column("reason", "reason"),
    Column("message", "message"),
)


def as_dict(row: Any) -> dict[str, Any]:
    """Rows come as SQLAlchemy Rows, mappings, dataclasses or pydantic models; the views want dicts."""
    if row is None:
        return {}
    if isinstance(row, Mapping):
        return dict(row)
    if hasattr(row, "_mapping"):
        return dict(row._mapping)
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    if hasattr(row, "model_dump"):
        return dict(row.model_dump())
    if hasattr(row, "_asdict"):
        return dict(row._asdict())
    return dict(vars(row))


def with_session(url: str, query: Callable[[Any], Awaitable[Any]]) -> Any:
    """Open the database, run ``query(session)`` in one read-only transaction, close everything."""
    from sqlalchemy.ext.asyncio import AsyncSession

    from dispatcher.db import make_engine
    from federation.errors import Invalid

    async def run() -> Any:
        try:
            engine = make_engine(url)
        except Invalid as exc:  # blame the flag the user typed, not the settings field
            raise Invalid("--database-url", exc.detail, fix=exc.fix) from None
        try:
            async with AsyncSession(engine) as session:
                return await query(session)
        finally:
            await engine.dispose()

    return await_maybe(run())


def cluster_health(row: Mapping[str, Any], now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    last = row.get("last_heartbeat")
    if not row.get("online") or last is None:
        return "offline"
    if last.tzinfo is None:
        last = last.replace(tzinfo=UTC)
    interval = float(row.get("interval_seconds") or 10.0)
    return "stale" if (now - last).total_seconds() > STALE_INTERVALS * interval else "online"


def cluster_view(row: Mapping[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """A clusters row plus the computed columns: health and the free cpu / GPUs from its capacity."""
    view = dict(row)
    view["health"] = cluster_health(row, now)
    capacity = row.get("capacity") or {}
    free = capacity.get("free", {}) if isinstance(capacity, Mapping) else {}
    view["cpu_free"] = free.get("cpu")
    view["gpu_free"] = free.get("nvidia.com/gpu")
    kinds = row.get("kinds")
    if isinstance(kinds, Mapping):
        view["kinds"] = sorted(kinds.get("reconciled", [])) + sorted(
            f"{k}->{v}" for k, v in (kinds.get("delegated") or {}).items())
    return view


def placement_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """One workload with its newest placement, spelled with the glossary's words."""
    view = dict(row)
    if "uid" not in view and "workload_uid" in view:
        view["uid"] = view["workload_uid"]
    return view


# --- commands -----------------------------------------------------------------------------------

placements_app = typer.Typer(help="Workloads and their placements, from the dispatcher's database.",
                             no_args_is_help=True)
clusters_app = typer.Typer(help="Worker clusters as their agents' heartbeats describe them.",
                           no_args_is_help=True)


def _queries() -> Any:
    from dispatcher.db import queries

    return queries


async def workloads_with_placement(session: Any, *, namespace: str | None = None, state: str | None = None,
                                   cluster: str | None = None, limit: int = 5000) -> list[Any]:
    """Every Workload (pending ones too) with its current placement attempt, newest first.

    The dispatcher's ``list_placements`` lists placement attempts only; the admin view also needs the
    Workloads that were never placed (pending, invalid), hence this outer join. Never commits.
    """
    import sqlalchemy as sa

    from dispatcher.db.models import placements, workloads

    current = sa.and_(placements.c.workload_uid == workloads.c.uid, placements.c.attempt == workloads.c.attempt)
    stmt = (sa.select(workloads.c.uid, workloads.c.namespace, workloads.c.name, workloads.c.kind,
                      workloads.c.queue, workloads.c.priority, workloads.c.state, workloads.c.attempt,
                      sa.func.coalesce(placements.c.cluster, workloads.c.cluster).label("cluster"),
                      sa.case((workloads.c.reason != "", workloads.c.reason), else_=placements.c.reason
                              ).label("reason"),
                      placements.c.state.label("placement_state"), placements.c.epoch,
                      workloads.c.created_at, placements.c.accepted_at, placements.c.finished_at)
            .select_from(workloads.outerjoin(placements, current))
            .order_by(workloads.c.created_at.desc(), workloads.c.uid).limit(limit))
    if namespace:
        stmt = stmt.where(workloads.c.namespace == namespace)
    if state:
        stmt = stmt.where(workloads.c.state == state)
    if cluster:
        stmt = stmt.where(sa.func.coalesce(placements.c.cluster, workloads.c.cluster) == cluster)
    return list(await session.execute(stmt))


async def running_per_cluster(session: Any) -> dict[str, int]:
    """Placements holding a cluster now (accepted or running), per cluster. Never commits."""
    import sqlalchemy as sa

    from dispatcher.db.models import placements

    result = await session.execute(
        sa.select(placements.c.cluster, sa.func.count()).where(placements.c.state.in_(("accepted", "running")))
        .group_by(placements.c.cluster))
    return {str(r[0]): int(r[1]) for r in result}


@placements_app.command("list")
def placements_list(
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
    namespace: Annotated[str | None, typer.Option("-n", "--namespace", help="Only this namespace.")] = None,
    state: Annotated[str | None, typer.Option("--state", help="Only workloads in this state.")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Only workloads placed on this cluster.")] = None,
) -> None:
    """List workloads with their current placement: job, kind, queue, cluster, state, reason, age."""
    rows = with_session(database_url_from(database_url), lambda s: workloads_with_placement(
        s, namespace=namespace, state=state, cluster=cluster))
    views = [placement_view(as_dict(r)) for r in rows]
    typer.echo(output.render(views, PLACEMENT_COLUMNS, output_format, kind="PlacementList"))


@placements_app.command("show")
def placements_show(
    job: Annotated[str, typer.Argument(help="NAMESPACE/NAME, NAME (namespace default) or the workload uid.")],
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
) -> None:
    """Show one workload: its spec summary, every placement attempt and its history of events."""
    queries = _queries()

    async def query(session: Any) -> Any:
        found = await queries.show_workload(session, job)
        if found is None and "/" not in job:
            found = await queries.show_workload(session, f"default/{job}")
        return found

    found = with_session(database_url_from(database_url), query)
    if not found:
        raise CommandFailed(f"job: no workload {job!r} in the dispatcher's database; "
                            "`mkctl placements list` shows the known ones")
    workload = as_dict(found.workload)
    history = [as_dict(p) for p in found.placements]
    events = [as_dict(e) for e in found.events]
    whole = {**workload, "placements": history, "events": events}
    typer.echo(output.render_one(whole, output_format, sections=[
        ("Placements", history, PLACEMENT_HISTORY_COLUMNS), ("Events", events, EVENT_COLUMNS)]))


@clusters_app.command("list")
def clusters_list(
    database_url: DatabaseUrl = None,
    output_format: Output = OutputFormat.table,
) -> None:
    """List worker clusters: health from the last heartbeat, running workloads, free capacity."""
    queries = _queries()

    async def query(session: Any) -> tuple[list[Any], dict[str, int]]:
        return list(await queries.list_clusters(session)), await running_per_cluster(session)

    now = datetime.now(UTC)
    rows, running = with_session(database_url_from(database_url), query)
    views = []
    for r in rows:
        view = cluster_view(as_dict(r), now)
        view["running"] = running.get(view["name"], 0)
        views.append(view)
    typer.echo(output.render(views, CLUSTER_COLUMNS, output_format, kind="ClusterList",
                             empty="No clusters have sent a heartbeat yet."))


def register(app: typer.Typer) -> None:
    app.add_typer(placements_app, name="placements")
    app.add_typer(clusters_app, name="clusters")


__all__: Sequence[str] = ("cluster_health", "cluster_view", "placement_view", "register")
