"""``mkctl pods`` and ``mkctl logs``: a placed Job's pods, their Events and container logs, read on its worker
cluster through the dispatcher's API (``--server``, env ``MKD_SERVER``; the agents are reached only by the
dispatcher). Who may read is decided by RBAC on the manager cluster: ``list pods`` for pods and Events,
``get pods/log`` for logs, in the Job's namespace (``--token``). ``logs`` is shaped like ``kubectl logs``:
the default pod is the first of the lead role (master, launcher, head, then index 0), ``-f`` follows until
the container ends or Ctrl-C.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from federation.errors import Invalid
from mkctl import output
from mkctl.admin import Output, Server, Token
from mkctl.errors import CommandFailed
from mkctl.output import Column, OutputFormat

POD_COLUMNS = (
    Column("name", "name"), Column("role", "role"), Column("index", "index"), Column("phase", "phase"),
    Column("ready", "ready"), Column("restarts", "restarts"), Column("node", "node"), Column("age", "age"),
    Column("reason", "why"), Column("containers", "containers", wide=True),
)
EVENT_COLUMNS = (
    Column("last", "age"), Column("type", "type"), Column("object", "object"), Column("reason", "reason"),
    Column("count", "count", wide=True), Column("message", "message"),
)


def _ref(job: str) -> tuple[str, str]:
    namespace, _, name = job.rpartition("/")
    if not name:
        raise Invalid("job", f"{job!r} names no Job", fix="write NAMESPACE/NAME or NAME (namespace default)")
    return namespace or "default", name


def _server(server: str | None) -> str:
    if not server:
        raise CommandFailed("pods and logs are read on the worker clusters through the dispatcher: pass "
                            "--server URL (and --token) or set MKD_SERVER", code=2)
    return server.rstrip("/")


def _failure(server: str, status: int, body: bytes) -> CommandFailed:
    import json

    try:
        detail: Any = json.loads(body).get("detail", body.decode(errors="replace"))
    except ValueError:
        detail = body.decode(errors="replace")
    if isinstance(detail, dict):
        detail = detail.get("message") or detail
    elif isinstance(detail, list):
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail)
    return CommandFailed(f"{server} answered {status}: {detail}", code=2 if status in (400, 422) else 1)


def _age(stamp: str) -> str:
    if not stamp:
        return "-"
    try:
        return output.age(datetime.fromisoformat(stamp.replace("Z", "+00:00")), datetime.now(UTC))
    except ValueError:
        return stamp


def pods(job: Annotated[str, typer.Argument(help="NAMESPACE/NAME or NAME (namespace default).")],
         attempt: Annotated[int | None, typer.Option("--attempt", min=1, help="An earlier placement attempt, "
                                                     "while its copy exists.")] = None,
         output_format: Output = OutputFormat.table, server: Server = None, token: Token = None) -> None:
    """The Job's pods on its cluster: role, index, phase, ready, restarts, node, age, why it waits or ended; then
    the Events of its pods and worker copy."""
    import httpx

    base = _server(server)
    namespace, name = _ref(job)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        got = httpx.get(f"{base}/api/v1/workloads/{namespace}/{name}/pods", headers=headers, timeout=60,
                        params={"attempt": attempt} if attempt else None)
    except httpx.HTTPError as exc:
        raise CommandFailed(f"--server: cannot reach {base}: {exc}") from None
    if got.status_code >= 400:
        raise _failure(base, got.status_code, got.content)
    answer = got.json()
    if output_format in (OutputFormat.json, OutputFormat.yaml):
        typer.echo(output.render_one(answer, output_format))
        return
    rows = [{**p, "age": _age(p.get("created") or ""),
             "why": f"{p['reason']}: {p['message']}" if p.get("reason") and p.get("message") else p.get("reason")}
            for p in answer.get("pods") or ()]
    typer.echo(f"cluster {answer['cluster']}, attempt {answer['attempt']}")
    typer.echo(output.render(rows, POD_COLUMNS, output_format, empty="No pods (yet)."))
    events = [{**e, "age": _age(e.get("last") or "")} for e in answer.get("events") or ()]
    if events:
        typer.echo("\nEvents:")
        typer.echo(output.table(events, EVENT_COLUMNS, wide=output_format is OutputFormat.wide, max_width=120))


def logs(
    job: Annotated[str, typer.Argument(help="NAMESPACE/NAME or NAME (namespace default).")],
    role: Annotated[str, typer.Option("--role", help="The pod's role (PodSet): master, worker, launcher, ...")] = "",
    index: Annotated[int | None, typer.Option("--index", min=0, help="The pod's index within its role.")] = None,
    pod: Annotated[str, typer.Option("--pod", help="The pod by name (see `mkctl pods`).")] = "",
    container: Annotated[str, typer.Option("-c", "--container", help="The container (default: the pod's "
                                                                     "default container, else its first).")] = "",
    previous: Annotated[bool, typer.Option("-p", "--previous", help="The container's previous run, before "
                                                                    "its last restart.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", min=0, help="Only the last N lines.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only lines newer than this: 30s, 5m, 1h.")] = None,
    timestamps: Annotated[bool, typer.Option("--timestamps", help="Each line with its time.")] = False,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing until the container ends "
                                                                "(Ctrl-C stops).")] = False,
    limit_bytes: Annotated[int | None, typer.Option("--limit-bytes", min=1, help="Stop after N bytes.")] = None,
    attempt: Annotated[int | None, typer.Option("--attempt", min=1, help="An earlier placement attempt.")] = None,
    server: Server = None, token: Token = None,
) -> None:
    """A container's log from the Job's pod on its worker cluster, like `kubectl logs`."""
    import httpx

    base = _server(server)
    namespace, name = _ref(job)
    params = {"role": role, "index": index, "pod": pod, "container": container, "previous": previous or None,
              "tail": tail, "since": since, "timestamps": timestamps or None, "follow": follow or None,
              "limit_bytes": limit_bytes, "attempt": attempt}
    query = {k: v for k, v in params.items() if v not in (None, "")}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    out = sys.stdout.buffer
    try:
        with httpx.stream("GET", f"{base}/api/v1/workloads/{namespace}/{name}/logs", params=query,
                          headers=headers, timeout=httpx.Timeout(60, read=None)) as got:
            if got.status_code >= 400:
                raise _failure(base, got.status_code, got.read())
            for chunk in got.iter_raw():
                out.write(chunk)
                out.flush()
    except httpx.HTTPError as exc:
        raise CommandFailed(f"--server: {base}: {exc}") from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def register(app: typer.Typer) -> None:
    app.command("pods")(pods)
    app.command("logs")(logs)
