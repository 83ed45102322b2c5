"""``mkctl handover status|report``: moving Jobs between controllers, as a platform team watches it.

``status``: Jobs per controller (managedBy), namespace and kind on the manager, as the dispatcher last
counted them. ``report``: for the Jobs of other controllers that a HandoverPolicy selects, what mkd would
do with them: how many it would accept, why it would refuse the others, where they would run. In Kueue mode
(docs/KUEUE.md) the controller of a Job is the one whose admission check serves its ClusterQueue
(``mkd.dev/dispatcher`` or ``kueue.x-k8s.io/multikueue``), and ``report`` also covers the Jobs of every
ClusterQueue MultiKueue's check serves (policy ``ClusterQueue/<name>``). Both read the dispatcher's database
(``--database-url``) or ask its API (``--server``), through the read model.
"""

from __future__ import annotations

from typing import Annotated

import typer

from mkctl import output
from mkctl.admin import Server, Token, source
from mkctl.output import Column, OutputFormat
from mkctl.services import DatabaseUrl

app = typer.Typer(help="Hand Jobs over between controllers gradually: counts and the shadow report.",
                  no_args_is_help=True)

Output = Annotated[OutputFormat, typer.Option("-o", "--output", help="table, wide, json or yaml.",
                                              case_sensitive=False)]
Namespace = Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace.")]

STATUS_COLUMNS = [Column("NAMESPACE", "namespace"), Column("KIND", "kind"), Column("CONTROLLER", "controller"),
                  Column("JOBS", "jobs"), Column("COUNTED", "updated_at", wide=True)]
REPORT_COLUMNS = [Column("NAMESPACE", "namespace"), Column("KIND", "kind"), Column("JOBS", "jobs"),
                  Column("MKD WOULD ACCEPT", "would_accept"), Column("REFUSE", "would_refuse"),
                  Column("WOULD RUN ON", "would_run_on"), Column("CONTROLLERS", "controllers", wide=True),
                  Column("POLICIES", "policies", wide=True), Column("WARNED", "warned", wide=True)]
REFUSAL_COLUMNS = [Column("NAMESPACE", "namespace"), Column("KIND", "kind"), Column("JOBS", "jobs"),
                   Column("WHY MKD WOULD REFUSE", "reason")]


@app.command("status")
def status(database_url: DatabaseUrl = None, namespace: Namespace = None,
           output_format: Output = OutputFormat.table, server: Server = None, token: Token = None) -> None:
    """Jobs per controller, namespace and kind on the manager cluster; a warning per Route policy that
    routes nothing (no webhook registered, or its namespaces not opted in), with the fix."""
    page = source(database_url, server, token).handover_status(namespace)
    rows, warnings = page["items"], page["warnings"]
    typer.echo(output.render(rows, STATUS_COLUMNS, output_format, kind="HandoverStatus",
                             empty="No Jobs counted yet (is the dispatcher running with handover enabled?)."))
    for w in warnings:  # on stderr: -o json stays one document
        typer.echo(f"warning: {w['message']}", err=True)


@app.command("report")
def report(database_url: DatabaseUrl = None, namespace: Namespace = None,
           output_format: Output = OutputFormat.table, server: Server = None, token: Token = None) -> None:
    """Would it be safe to route these Jobs to mkd? What mkd would do with other controllers' Jobs (in Kueue mode
    also those of the ClusterQueues MultiKueue's check serves)."""
    rows = source(database_url, server, token).handover_report(namespace)
    empty = ("No shadow records: no HandoverPolicy selects a Job of another controller yet "
             "(kubectl get handoverpolicies).")
    if output_format in (OutputFormat.json, OutputFormat.yaml) or not rows:
        typer.echo(output.render(rows, REPORT_COLUMNS, output_format, kind="HandoverReport", empty=empty))
        return
    typer.echo(output.render(rows, REPORT_COLUMNS, output_format, kind="HandoverReport", empty=empty))
    refusals = [{"namespace": r["namespace"], "kind": r["kind"], **x} for r in rows for x in r["refusals"]]
    if refusals:
        typer.echo("")
        typer.echo(output.render(refusals, REFUSAL_COLUMNS, output_format))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="handover")
