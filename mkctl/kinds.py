"""``mkctl kinds``: the job kinds mkd dispatches (its own and those a declarations file adds), ``--update`` to
regenerate what deploy/ lists of mkd's own, ``--manifests`` to write the same rules for declared kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from federation.kinds import manifests
from federation.kinds.base import JobKind, dotted
from federation.kinds.declared import DeclarationsInvalid, load
from federation.kinds.registry import KINDS
from mkctl.errors import EXIT_USAGE, CommandFailed

ROOT = Path(__file__).resolve().parents[1]
"""The source tree (deploy/ is not part of an installed wheel)."""


def kinds(
    update: Annotated[bool, typer.Option(
        "--update", help="Rewrite the generated kind lists in deploy/ (RBAC, handover webhook, admission "
                         "policies) and the HandoverPolicy CRD from the kind registry.")] = False,
    root: Annotated[Path, typer.Option("--root", help="The source tree to update.", show_default=False)] = ROOT,
    kinds_file: Annotated[Path | None, typer.Option(
        "--kinds-file", help="A declarations file (externalFrameworks; the services' kinds_file): its kinds are "
                             "checked and listed too.", show_default=False)] = None,
    write_manifests: Annotated[Path | None, typer.Option(
        "--manifests", help="With --kinds-file: write the RBAC and admission manifests the declared kinds need "
                            "into this folder (manager.yaml, worker.yaml, admission.yaml), as deploy/ has them "
                            "for mkd's own kinds.", show_default=False)] = None,
    namespaces: Annotated[list[str] | None, typer.Option(
        "--namespace", help="With --manifests: a worker namespace Jobs land in, where the agent's writes are bound "
                            "(repeat it; deploy/worker binds mkd-jobs).", show_default=False)] = None,
) -> None:
    """List the job kinds mkd dispatches: apiVersion, plural, where managedBy and suspend live, who runs the
    worker copy (mkd's agent, or the worker's own controller)."""
    declared: tuple[JobKind, ...] = ()
    if kinds_file is not None:
        try:
            declared = load(kinds_file, KINDS)
        except DeclarationsInvalid as exc:
            raise CommandFailed(f"--kinds-file {exc}", code=EXIT_USAGE) from None
    if write_manifests is not None:
        if kinds_file is None:
            raise CommandFailed("--manifests: give the declarations with --kinds-file (deploy/ already has mkd's "
                                "own kinds: --update)", code=EXIT_USAGE)
        write_manifests.mkdir(parents=True, exist_ok=True)
        for name, text in manifests.declared_manifests(declared, namespaces or ["mkd-jobs"]).items():
            if text:
                (write_manifests / f"{name}.yaml").write_text(text, encoding="utf-8")
                typer.echo(f"wrote {write_manifests / f'{name}.yaml'}")
        return
    if not update:
        rows = [("KIND", "APIVERSION", "PLURAL", "MANAGEDBY", "SUSPEND", "RUN BY")]
        rows += [(k.name, k.api_version, k.plural, k.managed_by_field, dotted(k.suspend_path),
                  k.run_by + (" (declared)" if k in declared else "")) for k in (*KINDS, *declared)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            typer.echo(" ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]))
        return
    if not (root / "deploy").is_dir():
        raise CommandFailed(f"--update: {root} has no deploy/ (run it in mkd's source tree or give --root)",
                            code=EXIT_USAGE)
    try:
        changed = manifests.update(root, KINDS)
    except ValueError as exc:
        raise CommandFailed(f"--update: {exc}", code=EXIT_USAGE) from None
    typer.echo("\n".join(f"updated {path}" for path in changed) if changed else "every generated block is current")


def register(app: typer.Typer) -> None:
    app.command("kinds")(kinds)
