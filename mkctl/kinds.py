"""``mkctl kinds``: the job kinds mkd dispatches, and ``--update`` to regenerate what deploy/ lists of them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from federation.kinds import manifests
from federation.kinds.base import dotted
from federation.kinds.registry import KINDS
from mkctl.errors import EXIT_USAGE, CommandFailed

ROOT = Path(__file__).resolve().parents[1]
"""The source tree (deploy/ is not part of an installed wheel)."""


def kinds(
    update: Annotated[bool, typer.Option(
        "--update", help="Rewrite the generated kind lists in deploy/ (RBAC, handover webhook, admission "
                         "policies) and the HandoverPolicy CRD from the kind registry.")] = False,
    root: Annotated[Path, typer.Option("--root", help="The source tree to update.", show_default=False)] = ROOT,
) -> None:
    """List the job kinds mkd dispatches: apiVersion, plural, where managedBy and suspend live, who runs the
    worker copy (mkd's agent, or the worker's own controller)."""
    if not update:
        rows = [("KIND", "APIVERSION", "PLURAL", "MANAGEDBY", "SUSPEND", "RUN BY")]
        rows += [(k.name, k.api_version, k.plural, k.managed_by_field, dotted(k.suspend_path), k.run_by) for k in KINDS]
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
