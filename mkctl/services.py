"""``mkctl dispatcher``, ``mkctl agent``, ``mkctl db upgrade``, ``mkctl sim up`` and ``mkctl settings``.

The service commands get one flag per field of the service's settings class (see ``mkctl.flags``),
build the settings object, set up logging and run the service until SIGINT/SIGTERM, which sets the
service's ``stop`` event so it shuts down in stages. ``sim up`` hands over to kubesim's own entry
point; ``settings`` prints the configuration reference of docs/CONFIGURATION.md.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from federation import eventloop, gctune
from mkctl import flags
from mkctl.errors import EXIT_USAGE, CommandFailed

log = logging.getLogger("mkctl")

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///mkd.db"
"""Used by ``db upgrade`` and the admin commands when the dispatcher's settings class gives none."""


def setup_logging(debug: bool) -> None:
    """One line per record on stderr; ``--debug`` opens the gates, libraries stay at WARNING otherwise."""
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", force=True)
    if not debug:
        for noisy in ("kubernetes", "aiosqlite", "asyncio", "amqtt", "transitions", "alembic"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        # "Connection pool is full, discarding connection" only says a spare connection was closed.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """``asyncio.run`` a service whose ``stop`` event is set by SIGINT or SIGTERM (staged shutdown), on uvloop's
    event loop where it is installed (``federation.eventloop``)."""

    gctune.tune()  # imports are done: keep them out of the collector's passes (federation/gctune.py)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # not the main thread (tests), or Windows
                pass
        await main(stop)

    eventloop.run(runner())


def _debug(ctx: typer.Context | None) -> bool:
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(getattr(obj, "debug", False) or os.environ.get("MKD_DEBUG"))


def dispatcher_settings_class() -> type[BaseModel]:
    from dispatcher.settings import DispatcherSettings

    cls: type[BaseModel] = DispatcherSettings
    return cls


def agent_settings_class() -> type[BaseModel]:
    from worker_agent.settings import AgentSettings

    cls: type[BaseModel] = AgentSettings
    return cls


def fencer_settings_class() -> type[BaseModel]:
    from worker_agent.settings import FencerSettings

    cls: type[BaseModel] = FencerSettings
    return cls


def default_database_url() -> str:
    """The dispatcher's own default, so ``mkctl db upgrade`` and ``mkctl dispatcher`` agree."""
    try:
        field = dispatcher_settings_class().model_fields.get("database_url")
    except ImportError:
        return DEFAULT_DATABASE_URL
    default = field.get_default(call_default_factory=True) if field else None
    return str(default) if default else DEFAULT_DATABASE_URL


def database_url_from(option: str | None) -> str:
    """``--database-url`` beats ``MKD_DATABASE_URL`` / the dispatcher's own env var beats its default."""
    return (option or os.environ.get("MKD_DATABASE_URL") or os.environ.get("MKD_DISPATCHER_DATABASE_URL")
            or default_database_url())


DatabaseUrl = Annotated[str | None, typer.Option(
    "--database-url", help="SQLAlchemy URL of the dispatcher's database "
    "(sqlite+aiosqlite:///path or postgresql+asyncpg://user@host/db). "
    "\\[env: MKD_DATABASE_URL or MKD_DISPATCHER_DATABASE_URL]",
    show_default=False)]


def await_maybe(value: Any) -> Any:
    """Run a coroutine to completion, or return a plain value (sync and async query APIs alike)."""
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value


# --- the services ------------------------------------------------------------------------------


def _run_dispatcher(settings: BaseModel) -> None:
    from dispatcher import app as dispatcher_app

    run_until_signal(lambda stop: dispatcher_app.run(settings, stop=stop))  # type: ignore[arg-type]


def _run_agent(settings: BaseModel) -> None:
    from worker_agent import app as agent_app

    run_until_signal(lambda stop: agent_app.run(settings, stop=stop))  # type: ignore[arg-type]


def _run_fencer(settings: BaseModel) -> None:
    from worker_agent import fencer

    run_until_signal(lambda stop: fencer.run(settings, stop=stop))  # type: ignore[arg-type]


def _service_command(app: typer.Typer, name: str, doc: str, load: Callable[[], type[BaseModel]],
                     run: Callable[[BaseModel], None]) -> None:
    def body(settings: BaseModel, ctx: typer.Context) -> None:
        setup_logging(_debug(ctx))
        log.info("starting %s", name)
        run(settings)

    ctx_param = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    try:
        cls = load()
    except ImportError as exc:
        missing = str(exc)

        def unavailable() -> None:
            raise CommandFailed(f"{name} is not available in this installation ({missing})")

        unavailable.__doc__ = doc
        app.command(name)(unavailable)
        return
    app.command(name, context_settings={"max_content_width": 110})(
        flags.settings_command(cls, body, extra=[ctx_param], name=name, doc=doc))


# --- db ------------------------------------------------------------------------------------------

db_app = typer.Typer(help="The dispatcher's database.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseUrl = None,
               wait: Annotated[float, typer.Option(
                   "--wait", min=0, help="Seconds to wait for a database that is not reachable yet (an init "
                   "container started together with its database), logging the outage once a minute; 0: fail at once.")] = 0.0,
               ) -> None:
    """Apply every alembic migration the database is missing (idempotent)."""
    from dispatcher import db

    url = database_url_from(database_url)
    if wait <= 0:
        db.upgrade(url)
    else:
        asyncio.run(_upgrade_waiting(url, wait))
    typer.echo(f"database {redact(url)} is at the current schema")


async def _upgrade_waiting(url: str, wait: float) -> None:
    """The migrations, an outage of the database waited out for up to ``wait`` seconds (dispatcher/replica/startup.py)."""
    from dispatcher import db
    from dispatcher.replica.startup import Startup
    from federation.clock import SystemClock

    startup = Startup(SystemClock(), 2.0)
    try:
        await asyncio.wait_for(startup.step("upgrading the schema", lambda: db.upgrade_async(url), asyncio.Event()),
                               wait)
    except TimeoutError:
        raise CommandFailed(f"database {redact(url)} still unreachable after {wait:g}s ({startup.last_error}); "
                            "check --database-url and that the database is up") from None


def redact(url: str) -> str:
    """A database or broker URL without its password, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    userinfo, _, host = rest.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in userinfo else url


# --- sim -------------------------------------------------------------------------------------------

sim_app = typer.Typer(help="kubesim, the Kubernetes API emulator the demo and tests run on.",
                      no_args_is_help=True)


@sim_app.command("up", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sim_up(ctx: typer.Context,
           state_dir: Annotated[Path, typer.Option("--state-dir", help="Where the kubeconfigs are written.")] = Path(
               "state/sim"),
           ) -> None:
    """Serve simulated clusters until ^C: the demo's topology unless --clusters/--topology say otherwise.

    Other arguments go to kubesim's own entry point (``python -m kubesim --help`` lists them).
    """
    from mkctl.topology import _kubesim

    kubesim = _kubesim()
    argv = ["--state-dir", str(state_dir), *ctx.args]
    if not any(a.startswith(("--clusters", "--topology")) for a in ctx.args):
        argv += ["--topology", str(write_demo_topology(state_dir))]
    raise typer.Exit(kubesim.cli_main(argv))


def write_demo_topology(state_dir: Path) -> Path:
    """The demo's clusters (mkctl.topology) as a kubesim topology file."""
    import dataclasses

    import yaml

    from mkctl.topology import default_workers, manager_spec

    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "topology.yaml"
    clusters = [dataclasses.asdict(spec) for spec in [manager_spec(), *default_workers()]]
    path.write_text(yaml.safe_dump({"clusters": clusters}, sort_keys=False), encoding="utf-8")
    return path


# --- settings reference ---------------------------------------------------------------------------


def settings_reference(
    service: Annotated[str, typer.Argument(help="dispatcher, agent or fencer")],
    update: Annotated[Path | None, typer.Option(
        "--update", help="Rewrite the table between this service's markers in a Markdown file (docs/CONFIGURATION.md).",
        show_default=False)] = None,
) -> None:
    """Print the configuration reference of a service as a Markdown table (flag, env var, default, meaning)."""
    loaders = {"dispatcher": dispatcher_settings_class, "agent": agent_settings_class,
               "fencer": fencer_settings_class}
    if service not in loaders:
        raise CommandFailed(f"service: {service!r} is not known; use one of {', '.join(loaders)}", code=EXIT_USAGE)
    table = flags.reference_markdown(loaders[service]())
    if update is None:
        typer.echo(table)
        return
    text = update.read_text(encoding="utf-8")
    begin, end = reference_markers(service)
    if begin not in text or end not in text:
        raise CommandFailed(f"--update: {update} has no {begin} ... {end} markers", code=EXIT_USAGE)
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    update.write_text(f"{head}{begin}\n{table}\n{end}{tail}", encoding="utf-8")
    typer.echo(f"updated the {service} settings in {update}")


def reference_markers(service: str) -> tuple[str, str]:
    return f"<!-- settings:{service} -->", f"<!-- /settings:{service} -->"


def register(app: typer.Typer) -> None:
    _service_command(app, "dispatcher",
                     "Run the dispatcher (manager cluster): claim managedBy=multikueue jobs, place them on "
                     "worker clusters, mirror their status.", dispatcher_settings_class, _run_dispatcher)
    _service_command(app, "agent",
                     "Run an agent (one per worker cluster): run placed jobs and report back.",
                     agent_settings_class, _run_agent)
    _service_command(app, "fencer",
                     "Run a worker cluster's fencer (a process apart from the agent): stop the agent's jobs "
                     "when the lease it records in the cluster runs out.",
                     fencer_settings_class, _run_fencer)
    app.add_typer(db_app, name="db")
    app.add_typer(sim_app, name="sim")
    app.command("settings")(settings_reference)
