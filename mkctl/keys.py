"""Keys and cluster identity: ``mkctl keys generate|public`` and ``mkctl clusters register|unregister|refused``.

Every message on the wire is signed (``federation.signing``). The dispatcher knows a cluster by the
public key registered here; an agent whose cluster has no key is refused and listed by
``mkctl clusters refused``, never created. The same key seals the cluster's Places: the dispatcher
encrypts each one to the X25519 key derived from it (``federation.sealing``), so a cluster needs no
other key.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from federation import signing, topics
from mkctl import output
from mkctl.admin import Output, Server, Token, clusters_app, source
from mkctl.output import Column, OutputFormat
from mkctl.services import DatabaseUrl, database_url_from

keys_app = typer.Typer(help="Ed25519 keys for signing Commands and Reports (an agent's also opens the Places "
                                    "sealed to it).", no_args_is_help=True)
REFUSED_COLUMNS = (Column("sender", "name"), Column("reason", "reason"), Column("count", "count"),
                   Column("last", "last_at"), Column("first", "first_at", wide=True),
                   Column("message", "message", wide=True))


def _in_db(url: str | None, fn: Any) -> Any:
    from dispatcher import db

    async def run() -> Any:
        engine = db.make_engine(database_url_from(url))
        try:
            async with db.sessionmaker(engine).begin() as s:
                return await fn(s)
        finally:
            await engine.dispose()
    return asyncio.run(run())


@keys_app.command("generate")
def keys_generate(
    out: Annotated[Path | None, typer.Option("--out", help="Write the private key to this file (mode 600) "
                                             "instead of printing it.")] = None,
) -> None:
    """Make a key pair: the private key goes in a Secret, the public one is registered / trusted."""
    private, public = signing.generate()
    if out is not None:
        out.touch(mode=0o600)
        out.write_text(private + "\n")
        typer.echo(f"private key written to {out}")
    else:
        typer.echo(f"private: {private}")
    typer.echo(f"public:  {public}")


@keys_app.command("public")
def keys_public(private_key_file: Annotated[Path, typer.Option("--private-key-file", help="The private key.")]) -> None:
    """Print the public key of a private key file."""
    key = signing.load_private_key(None, private_key_file, "--private-key-file")
    typer.echo(signing.public_text(key.public_key()))


@clusters_app.command("register")
def clusters_register(
    name: Annotated[str, typer.Argument(help="Cluster name (its agent's cluster_name).")],
    public_key: Annotated[str, typer.Option("--public-key", help="The agent's public key (base64, as "
                                            "`mkctl keys generate` prints it).")],
    database_url: DatabaseUrl = None,
) -> None:
    """Trust a cluster: its agent's Reports are accepted once signed by this key (a new key replaces the old)."""
    from dispatcher.db.queries import clusters as cluster_q

    topics.check_cluster_name(name, "NAME")
    signing.parse_public_key(public_key, "--public-key")
    new = _in_db(database_url, lambda s: cluster_q.register_cluster(s, name, public_key.strip(), datetime.now(UTC)))
    typer.echo(f"cluster {name} {'registered' if new else 'key replaced'}; the dispatcher trusts it within "
               "cluster_keys_refresh_seconds")


@clusters_app.command("unregister")
def clusters_unregister(name: Annotated[str, typer.Argument(help="Cluster name.")],
                        database_url: DatabaseUrl = None) -> None:
    """Stop trusting a cluster: its Reports are refused from the next key refresh on."""
    from dispatcher.db.queries import clusters as cluster_q

    if not _in_db(database_url, lambda s: cluster_q.unregister_cluster(s, name, datetime.now(UTC))):
        raise typer.BadParameter(f"cluster {name!r} has no registered key", param_hint="NAME")
    typer.echo(f"cluster {name} unregistered")


@clusters_app.command("refused")
def clusters_refused(database_url: DatabaseUrl = None, output_format: Output = OutputFormat.table,
                     server: Server = None, token: Token = None) -> None:
    """Senders the dispatcher refused because no key is registered for them (not clusters: never created)."""
    rows = source(database_url, server, token).refused()
    typer.echo(output.render(rows, REFUSED_COLUMNS, output_format, kind="RefusedSenderList",
                             empty="No sender was refused for want of a registered key."))


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
