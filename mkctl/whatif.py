"""``mkctl whatif``: replay a workload against another configuration before changing it, and ``whatif export``.

The trace is a JSON Lines file (``--trace``) or the dispatcher's own history (``--from-history``, the default,
of the last ``--since`` 7d); the configuration is YAML files or folders (``--config``) of Kueue objects, ``WhatIfSettings``
and ``WorkerCluster`` objects, and whatever part they do not give comes from the live system: the clusters
from the database, the queue objects from the manager cluster (``--kubeconfig``), the settings from the
dispatcher's environment. ``--compare`` replays the same trace against a second configuration made of the
first with the objects it gives replaced. The replay is :mod:`dispatcher.whatif.sim`, the report
:mod:`dispatcher.whatif.report`.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from dispatcher.whatif import config as wconfig
from dispatcher.whatif import report, sim, trace
from dispatcher.whatif.service import parse_since
from federation.errors import Invalid
from mkctl.errors import CommandFailed
from mkctl.services import DatabaseUrl, database_url_from

whatif_app = typer.Typer(help="Replay a workload (the dispatcher's history, or --trace) against a configuration "
                              "(--config; the live one for what it does not give) and report waits, admissions, "
                              "preemptions, borrowing and utilisation; --compare sets a change side by side.",
                         invoke_without_command=True)

Kubeconfig = Annotated[str | None, typer.Option(
    "--kubeconfig", envvar="KUBECONFIG", show_default=False,
    help="Manager cluster kubeconfig: the live queue objects (ClusterQueues, LocalQueues, ...) when --config "
         "gives none.")]
Since = Annotated[str | None, typer.Option(
    "--since", show_default=False,
    help="With the history: the Jobs queued within this long (7d, 12h, 30m), since this time (RFC 3339), or all. "
         "[default: 7d]")]
DEFAULT_SINCE = "7d"


def _history(database_url: str | None, since: datetime | None) -> list[trace.TraceJob]:
    from dispatcher.whatif import history
    from mkctl.admin_source import with_session

    jobs: list[trace.TraceJob] = with_session(database_url_from(database_url),
                                              lambda s: history.trace_from_history(s, since))
    return jobs


def read_trace(path: str | None, from_history: bool, database_url: str | None, since: str | None
               ) -> tuple[list[trace.TraceJob], str]:
    if path and from_history:
        raise Invalid("--trace", "and --from-history both name a trace", fix="give one of them")
    if path and since:
        raise Invalid("--since", "applies to the history, not to a trace file", fix="drop --since, or --trace")
    if path:
        p = Path(path)
        if not p.is_file():
            raise Invalid("--trace", f"{path} is not a file", fix="give a JSON Lines file (mkctl whatif export writes one)")
        with p.open("rb") as f:
            try:
                return trace.parse(f), path
            except trace.TraceError as exc:
                raise Invalid(f"{path} {exc.field}", exc.detail, fix=exc.fix) from None
    since = since or DEFAULT_SINCE
    jobs = _history(database_url, parse_since(since))
    return jobs, "the dispatcher's history" + (f" of the last {since}" if since[-1:].isalpha() and since != "all"
                                               else f" since {since}" if since != "all" else "")


def live_config(database_url: str | None, kubeconfig: str | None, *, need_queues: bool, need_clusters: bool
                ) -> wconfig.Config:
    """The parts of the live configuration a run needs: clusters from the database, queue objects from the
    manager, the settings of the dispatcher's environment."""
    from dispatcher.whatif import history
    from mkctl.admin_source import with_session

    out = wconfig.Config(settings=history.live_settings(), sources=["the dispatcher's settings (environment)"])
    if need_clusters:
        out.clusters = with_session(database_url_from(database_url), history.live_clusters)
        out.sources.append("the clusters in the database")
        if not out.clusters:
            raise Invalid("--config", "no cluster is given and the database knows none",
                          fix="add WorkerCluster objects to --config, or point --database-url at the dispatcher's")
    if need_queues:
        if not kubeconfig:
            raise Invalid("--config", "no ClusterQueue is given and the manager cluster is not reachable",
                          fix="pass --kubeconfig (the manager cluster) or add the Kueue objects to --config")
        out.objects = _manager_objects(kubeconfig)
        out.sources.append(f"the queue objects of the manager cluster ({kubeconfig})")
    return out


def _manager_objects(kubeconfig: str) -> list[dict[str, Any]]:
    from dispatcher.whatif import history
    from federation.kube import Kube
    from federation.settings import KubeSettings
    from mkctl.services import await_maybe

    async def read() -> list[dict[str, Any]]:
        async with Kube.from_settings(KubeSettings(kubeconfig=Path(kubeconfig), timeout=10)) as kube:
            return await history.live_queue_objects(kube)

    objects: list[dict[str, Any]] = await_maybe(read())
    return objects


def build_config(paths: list[str], database_url: str | None, kubeconfig: str | None) -> wconfig.Config:
    given = wconfig.load(paths) if paths else wconfig.Config()
    kinds = {o["kind"] for o in given.objects}
    need_queues = not kinds & set(wconfig.KUEUE_KINDS)
    need_clusters = not given.clusters
    if paths and not need_queues and not need_clusters:
        from dispatcher.whatif import history

        live = wconfig.Config(settings=history.live_settings(), sources=["the dispatcher's settings (environment)"])
        return wconfig.load(paths, live)
    base = live_config(database_url, kubeconfig, need_queues=need_queues, need_clusters=need_clusters)
    return wconfig.load(paths, base) if paths else base


def _progress(total: int) -> sim.Progress | None:
    if total < 10_000:
        return None

    def show(done: int, of: int, t: float) -> None:
        print(f"whatif: {done:,} of {of:,} Jobs done, {t / 3600:.1f} h of trace time", file=sys.stderr, flush=True)
    return show


@whatif_app.callback()
def whatif(
    ctx: typer.Context,
    trace_path: Annotated[str | None, typer.Option(
        "--trace", "-t", show_default=False, help="A JSON Lines trace, one Job per line (see docs/WHATIF.md).")] = None,
    from_history: Annotated[bool, typer.Option(
        "--from-history", help="Build the trace from the dispatcher's database (the default without --trace).")] = False,
    since: Since = None,
    config_paths: Annotated[list[str] | None, typer.Option(
        "--config", "-c", show_default=False,
        help="YAML files or folders: Kueue objects, WhatIfSettings, WorkerCluster. Parts not given come from the "
             "live system.")] = None,
    compare: Annotated[list[str] | None, typer.Option(
        "--compare", show_default=False,
        help="YAML files or folders whose objects replace those of the same kind and name in the first "
             "configuration: both are replayed and set side by side.")] = None,
    output_format: Annotated[str, typer.Option("-o", "--output", help="table or json.")] = "table",
    plot: Annotated[str | None, typer.Option(
        "--plot", show_default=False, help="Also draw queue depth and utilisation over time into this PNG.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines on long runs.")] = False,
    database_url: DatabaseUrl = None,
    kubeconfig: Kubeconfig = None,
) -> None:
    """Replay a trace against a configuration and report waits, admissions, preemptions and utilisation."""
    if ctx.invoked_subcommand is not None:
        return
    if output_format not in ("table", "json"):
        raise Invalid("--output", f"{output_format!r} is not table or json", fix="use -o table or -o json")
    jobs, where = read_trace(trace_path, from_history, database_url, since)
    if not jobs:
        raise CommandFailed(f"the trace ({where}) holds no Job: nothing to replay")
    cfg = build_config(list(config_paths or []), database_url, kubeconfig)
    progress = None if quiet else _progress(len(jobs))
    run_a = sim.simulate(jobs, cfg, progress=progress)
    rep_a = report.summarize(run_a)
    rep_a["sources"] = {"trace": where, "configuration": cfg.sources}
    runs, titles = [run_a], [" + ".join(Path(c).name for c in config_paths or []) or "live configuration"]
    if compare:
        other = wconfig.load(list(compare), cfg, overlay=True)
        run_b = sim.simulate(jobs, other, progress=progress)
        rep_b = report.summarize(run_b)
        rep_b["sources"] = {"trace": where, "configuration": other.sources}
        runs.append(run_b)
        titles.append("with " + ", ".join(Path(c).name for c in compare))
        diff = report.compare(rep_a, rep_b)
        if output_format == "json":
            typer.echo(orjson.dumps({"a": rep_a, "b": rep_b, "comparison": diff}, option=orjson.OPT_INDENT_2).decode())
        else:
            typer.echo(f"trace: {where}, {len(jobs)} Jobs")
            typer.echo(report.compare_text(diff, (titles[0], titles[1])))
    elif output_format == "json":
        typer.echo(orjson.dumps(rep_a, option=orjson.OPT_INDENT_2).decode())
    else:
        typer.echo(f"trace: {where}; configuration: {'; '.join(cfg.sources)}")
        typer.echo(report.text(rep_a))
    if plot:
        from dispatcher.whatif import plot as wplot

        wplot.png(plot, runs, titles)
        print(f"whatif: plot written to {plot}", file=sys.stderr)


@whatif_app.command("export")
def export(
    out: Annotated[str, typer.Option("--output-file", "-f", help="Where to write the trace (- for stdout).")] = "-",
    since: Since = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Write the dispatcher's history as a JSON Lines trace, to edit or share and replay with --trace."""
    jobs = _history(database_url, parse_since(since or DEFAULT_SINCE))
    data = trace.dump(jobs)
    if out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        Path(out).write_bytes(data)
        estimated = sum(1 for j in jobs if j.run_estimated)
        typer.echo(f"wrote {len(jobs)} Jobs to {out}" + (f" ({estimated} with an estimated run time: still running "
                                                           "or never started)" if estimated else ""))


def register(app: typer.Typer) -> None:
    app.add_typer(whatif_app, name="whatif")
