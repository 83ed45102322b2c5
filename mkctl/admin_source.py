"""Where the admin commands read from: the dispatcher's database (default) or its HTTP API (``--server``).

Both sources answer the same questions with the same plain dicts, so every ``mkctl`` admin verb prints
the same columns whichever it used. :class:`DatabaseSource` runs the query functions of
``dispatcher.readmodel`` (the functions the API and the dashboard call) in one read-only session per call; :class:`ApiSource` calls the dispatcher's
``/api/v1`` with a bearer token. Actions (cordon, drain, requeue, evict, pin) change what the
dispatcher decides, so only the API carries them: the database source refuses them naming ``--server``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from federation.errors import Invalid
from mkctl.errors import CommandFailed
from mkctl.services import await_maybe


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


def _iso_times(row: dict[str, Any]) -> dict[str, Any]:
    """The API sends times as ISO strings; the views age datetimes, so read them back."""
    for key, value in row.items():
        if isinstance(value, str) and (key == "at" or key.endswith(("_at", "heartbeat", "_since"))) and value:
            try:
                row[key] = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                pass
    return row


class DatabaseSource:
    """Reads the dispatcher's database directly (no dispatcher needs to run) and, given a kubeconfig, the
    manager cluster for what lives there (conditions, ClusterQueues, Jobs mkd did not claim)."""

    def __init__(self, url: str, kubeconfig: str | None = None) -> None:
        self.url = url
        self.kubeconfig = kubeconfig

    def _read(self, query: Callable[[Any, Any], Awaitable[Any]]) -> Any:
        """``query(session, kube)`` in one read-only session; kube is the manager's client or None."""
        if not self.kubeconfig:
            return with_session(self.url, lambda s: query(s, None))
        from pathlib import Path

        from federation.kube import Kube
        from federation.settings import KubeSettings

        async def with_kube(session: Any) -> Any:
            settings = KubeSettings(kubeconfig=Path(self.kubeconfig or ""), timeout=10)
            async with Kube.from_settings(settings) as kube:
                return await query(session, kube)

        return with_session(self.url, with_kube)

    def workloads(self, f: Any, *, limit: int = 5000) -> list[dict[str, Any]]:
        from dispatcher import readmodel

        return list(self._read(lambda s, _: readmodel.workloads(s, f, limit=limit)))

    def workload(self, ref: str) -> dict[str, Any] | None:
        from dispatcher import readmodel

        found = self._read(lambda s, kube: readmodel.workload(s, ref, kube))
        return None if found is None else dict(found)

    def unclaimed(self, namespace: str, name: str) -> str | None:
        """Ask the manager cluster who manages a Job mkd never claimed (only with ``--kubeconfig``)."""
        if not self.kubeconfig:
            return None
        from dispatcher import readmodel

        async def query(_: Any, kube: Any) -> str | None:
            return await readmodel.unclaimed(kube, namespace, name)

        return self._read(query)  # type: ignore[no-any-return]

    def clusters(self) -> list[dict[str, Any]]:
        from dispatcher import readmodel

        return list(self._read(lambda s, _: readmodel.clusters(s)))

    def events(self, *, ref: str | None = None, cluster: str | None = None, type_: str | None = None,
               after_id: int = 0, limit: int = 500) -> list[dict[str, Any]]:
        from dispatcher import readmodel

        try:
            return list(self._read(lambda s, _: readmodel.events(s, ref=ref, cluster=cluster, type_=type_,
                                                                  after_id=after_id, limit=limit)))
        except readmodel.UnknownRef:
            raise CommandFailed(f"--for: no workload {ref!r} in the dispatcher's database; "
                                "`mkctl workloads list` shows the known ones") from None

    def queues(self) -> dict[str, Any]:
        from dispatcher import readmodel

        return dict(self._read(readmodel.queues))

    def refused(self) -> list[dict[str, Any]]:
        from dispatcher import readmodel

        return list(self._read(lambda s, _: readmodel.refused_senders(s)))

    def handover_status(self, namespace: str | None) -> dict[str, Any]:
        from dispatcher import readmodel

        return dict(self._read(lambda s, _: readmodel.handover_status(s, namespace)))

    def handover_report(self, namespace: str | None) -> list[dict[str, Any]]:
        from dispatcher import readmodel

        return list(self._read(lambda s, _: readmodel.handover_report(s, namespace)))

    def pending(self, *, cluster_queue: str | None = None, namespace: str | None = None,
                queue: str | None = None) -> list[dict[str, Any]]:
        from dispatcher import readmodel

        return list(self._read(lambda s, _: readmodel.pending(s, cluster_queue=cluster_queue, namespace=namespace,
                                                               queue=queue)))

    def why(self, ref: str) -> dict[str, Any] | None:
        from dispatcher import readmodel

        found = self._read(lambda s, kube: readmodel.why(s, ref, kube))
        return None if found is None else dict(found)

    def action(self, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raise CommandFailed("actions change what the dispatcher decides, so they go through its API: "
                            "pass --server URL (and --token) or set MKD_SERVER", code=2)


class ApiSource:
    """Calls the dispatcher's HTTP API (``mkctl ... --server URL --token T``)."""

    def __init__(self, server: str, token: str | None) -> None:
        self.server = server.rstrip("/")
        self.token = token

    def _call(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
              body: Mapping[str, Any] | None = None, missing_ok: bool = False) -> Any:
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        query = {k: v for k, v in (params or {}).items() if v not in (None, "", {}, [])}
        try:
            response = httpx.request(method, f"{self.server}/api/v1{path}", params=query, json=body,
                                     headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            raise CommandFailed(f"--server: cannot reach {self.server}: {exc}; check the address and that "
                                "the dispatcher's API is enabled (--api-port)") from None
        if response.status_code == 404 and missing_ok:
            return None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            if isinstance(detail, list):  # pydantic's validation errors
                detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}"
                                   for d in detail)
            code = 2 if response.status_code in (400, 422) else 1
            raise CommandFailed(f"{self.server} answered {response.status_code}: {detail}", code=code)
        return response.json()

    def workloads(self, f: Any, *, limit: int = 5000) -> list[dict[str, Any]]:
        labels = ",".join(f"{k}={v}" for k, v in f.labels.items())
        page = self._call("GET", "/workloads", params={
            "namespace": f.namespace, "kind": f.kind, "queue": f.queue, "cluster": f.cluster, "state": f.state,
            "label": labels, "limit": limit})
        return [_iso_times(dict(i)) for i in page["items"]]

    def workload(self, ref: str) -> dict[str, Any] | None:
        namespace, _, name = ref.rpartition("/")
        found = self._call("GET", f"/workloads/{namespace or 'default'}/{name}", missing_ok=True)
        if found is None:
            return None
        found = _iso_times(dict(found))
        found["placements"] = [_iso_times(dict(p)) for p in found.get("placements", [])]
        found["events"] = [_iso_times(dict(e)) for e in found.get("events", [])]
        found["conditions"] = [_iso_times(dict(c)) for c in found["conditions"]] \
            if found.get("conditions") is not None else None
        return dict(found)

    def unclaimed(self, namespace: str, name: str) -> str | None:
        found = self._call("GET", f"/jobs/{namespace}/{name}/owner", missing_ok=True)
        return None if found is None else str(found["message"])

    def clusters(self) -> list[dict[str, Any]]:
        return [_iso_times(dict(c)) for c in self._call("GET", "/clusters")["items"]]

    def queues(self) -> dict[str, Any]:
        return dict(self._call("GET", "/queues"))

    def refused(self) -> list[dict[str, Any]]:
        return [_iso_times(dict(r)) for r in self._call("GET", "/refused")["items"]]

    def handover_status(self, namespace: str | None) -> dict[str, Any]:
        page = self._call("GET", "/handover/status", params={"namespace": namespace})
        return {"items": [_iso_times(dict(r)) for r in page["items"]],
                "warnings": [_iso_times(dict(w)) for w in page["warnings"]]}

    def handover_report(self, namespace: str | None) -> list[dict[str, Any]]:
        return [_iso_times(dict(r)) for r in self._call("GET", "/handover/report",
                                                        params={"namespace": namespace})["items"]]

    def pending(self, *, cluster_queue: str | None = None, namespace: str | None = None,
                queue: str | None = None) -> list[dict[str, Any]]:
        page = self._call("GET", "/pending", params={"cluster_queue": cluster_queue, "namespace": namespace,
                                                     "queue": queue})
        return [_iso_times(dict(r)) for r in page["items"]]

    def why(self, ref: str) -> dict[str, Any] | None:
        namespace, _, name = ref.rpartition("/")
        if not namespace and len(name) >= 32:  # a uid: the API names Workloads by namespace/name
            found = self._call("GET", "/workloads", params={"limit": 5000})["items"]
            match = next((w for w in found if w["uid"] == name), None)
            if match is None:
                return None
            namespace, name = match["namespace"], match["name"]
        found = self._call("GET", f"/why/{namespace or 'default'}/{name}", missing_ok=True)
        return None if found is None else dict(found)

    def events(self, *, ref: str | None = None, cluster: str | None = None, type_: str | None = None,
               after_id: int = 0, limit: int = 500) -> list[dict[str, Any]]:
        page = self._call("GET", "/events", params={"workload": ref, "cluster": cluster, "type": type_,
                                                    "after": after_id or None, "limit": limit})
        return [_iso_times(dict(e)) for e in page["items"]]

    def action(self, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return dict(self._call("POST", path, body=body or {}))


Source = DatabaseSource | ApiSource
