"""``mkctl``: the root command group, its global flags and the one place failures are turned into words.

Sub-commands live in their own modules (services, admin, demo, sim); this module wires them together,
owns ``--version`` and ``--debug``, and wraps every command so a failure prints one ``error: ...``
line and exits non-zero instead of showing a traceback (``--debug`` or ``MKD_DEBUG=1`` shows it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from mkctl import admin, demo, handover, keys, kinds, podlogs, queues, services, whatif
from mkctl.errors import describe, print_error


def _fold_help_text() -> None:
    """Help boxes wrap a long value (a URL, a flag name) onto the next line instead of cutting it with '…'
    (rich's table cells cut by default; on an 80-column terminal or a pipe that cut what users copy)."""
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils

    if getattr(getattr(rich_utils, "Table", None), "folds", False):
        return

    class FoldingTable(Table):
        folds = True

        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            super().add_row(*renderables, **kwargs)
            for column in self.columns:
                column.overflow = "fold"

    setattr(rich_utils, "Table", FoldingTable)  # noqa: B010 (typer does not export the name it uses)
    parameter_help = rich_utils._get_parameter_help

    def folding_help(*args: Any, **kwargs: Any) -> Any:
        made = parameter_help(*args, **kwargs)
        for part in getattr(made, "renderables", []):
            if isinstance(part, Text):
                part.overflow = "fold"
        return made

    rich_utils._get_parameter_help = folding_help


_fold_help_text()


@dataclass
class Globals:
    """What the root callback learned, handed to sub-commands through ``ctx.obj``."""

    debug: bool = False


def mkd_version() -> str:
    try:
        return version("mkd")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


class ReportedErrors(TyperGroup):
    """The root group: runs the chosen command and turns any failure into one line and an exit code.

    ``--debug`` is the root's flag, but errors say "rerun with --debug" and people add it at the end
    (``make demo DEMO_ARGS=--debug`` runs ``mkctl demo --debug``): it is taken anywhere before ``--``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if ctx.parent is None and DEBUG_FLAG in args[1:]:
            end = args.index("--") if "--" in args else len(args)
            if DEBUG_FLAG in args[:end]:
                args = [DEBUG_FLAG, *(a for i, a in enumerate(args) if not (i < end and a == DEBUG_FLAG))]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.TyperException, typer.Exit, typer.Abort, KeyboardInterrupt, SystemExit):
            raise  # usage errors, explicit exits and ^C keep the framework's handling
        except Exception as exc:
            debug = (isinstance(ctx.obj, Globals) and ctx.obj.debug) or bool(os.environ.get("MKD_DEBUG"))
            if debug:
                raise
            message, code = describe(exc)
            print_error(message)
            raise typer.Exit(code) from None


DEBUG_FLAG = "--debug"

app = typer.Typer(
    cls=ReportedErrors,
    name="mkctl",
    help="mkd: dispatch training jobs from a manager cluster to worker clusters (MultiKueue style).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"mkctl {mkd_version()}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", envvar="MKD_DEBUG",
                                        help="Show tracebacks and debug logs.")] = False,
    _version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                           help="Print the version and exit.")] = False,
) -> None:
    """mkd: dispatch training jobs from a manager cluster to worker clusters (MultiKueue style)."""
    ctx.obj = Globals(debug=debug)


services.register(app)
admin.register(app)
queues.register(app)
keys.register(app)
handover.register(app)
podlogs.register(app)
demo.register(app)
whatif.register(app)
kinds.register(app)


def kubectl_plugin() -> None:
    """``kubectl-mkd``: mkctl under kubectl's plugin convention, so ``kubectl mkd why ns/name`` works."""
    app(prog_name="kubectl mkd")


if __name__ == "__main__":  # python -m mkctl.main
    app()
