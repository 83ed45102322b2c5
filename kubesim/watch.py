"""Watch streams: the initial state or the history since a resourceVersion, then live events, as JSON lines.

Selectors are applied per event; an object that stops (starts) matching is sent as DELETED (ADDED), as
the real watch cache does. Bookmarks come every ``bookmark_seconds`` when asked for; a version older than
the store's window answers an ERROR event carrying a 410 Expired Status; ``timeoutSeconds`` ends the
stream cleanly and ``Faults.drop_watches`` cuts it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from kubesim import printing
from kubesim.errors import ApiError
from kubesim.httpserver import Request, StreamResponse
from kubesim.records import Rec
from kubesim.resources import ResourceType
from kubesim.selectors import matches, parse_field_selector, parse_label_selector

if TYPE_CHECKING:
    from kubesim.server import ApiServer, Target

JSON = "application/json"


class Feed:
    """A watch's pending lines. Commits append to it; the watch's writer takes everything pending at once
    and sleeps on a bare future when nothing is (no task and no queue getter per event, as
    ``asyncio.wait_for(queue.get())`` costs). ``None`` ends the watch.

    The time limit of a wait is kept by one timer that outlives the waits: a wait that ends with an
    event leaves it armed, and when it fires before the current wait's limit it is armed again for that
    limit (a timer per wait, set and cancelled for every event, was about a seventh of what a watch cost per
    event)."""

    __slots__ = ("_timer", "_until", "items", "loop", "waiter")

    def __init__(self) -> None:
        self.items: list[bytes | None] = []
        self.loop = asyncio.get_running_loop()
        self.waiter: asyncio.Future[None] | None = None
        self._until = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def put_nowait(self, item: bytes | None) -> None:
        self.items.append(item)
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def take(self, seconds: float) -> list[bytes | None]:
        """Everything pending, waiting up to ``seconds`` for something (empty: the time passed)."""
        if not self.items:
            loop = self.loop
            w = self.waiter = loop.create_future()
            until = self._until = loop.time() + seconds
            timer = self._timer
            if timer is None or timer.when() > until:
                if timer is not None:
                    timer.cancel()
                self._timer = loop.call_at(until, self._expire)
            try:
                await w
            finally:
                self.waiter = None
        items, self.items = self.items, []
        return items

    def _expire(self) -> None:
        self._timer = None
        w = self.waiter
        if w is None or w.done():
            return
        if self.loop.time() + 1e-6 >= self._until:
            w.set_result(None)
        else:  # armed for an earlier wait that ended with events: now keep the current one's limit
            self._timer = self.loop.call_at(self._until, self._expire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@dataclass(eq=False)
class Watcher:
    """One open watch: its pending events and connection (so that faults can cut it)."""

    queue: Feed
    transport: Any


async def serve_watch(server: ApiServer, request: Request, t: Target, name: str | None = None
                      ) -> StreamResponse:
    q = request.query
    rt = t.rt
    store = server.store
    lreq = parse_label_selector(q.get("labelSelector"))
    fsel = q.get("fieldSelector") or ""
    if name:
        fsel = f"metadata.name={name}" + ("," + fsel if fsel else "")
    freq = parse_field_selector(rt.key, fsel)
    ns = t.namespace
    bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
    timeout = float(q.get("timeoutSeconds") or 0) or 1800.0
    rv_param = q.get("resourceVersion") or ""
    send_initial = q.get("sendInitialEvents") == "true"
    queue = Feed()
    fields_match = store.fields_match

    def wanted(rec: Rec | None) -> bool:
        if rec is None:
            return False
        if ns and rec.ns != ns:
            return False
        if lreq and not matches(lreq, rec.labels):
            return False
        return not (freq and not fields_match(freq, rec))

    as_table = printing.wants_table(request.headers.get("Accept", ""))
    include_object = q.get("includeObject", "Metadata")

    def line(etype: str, rec: Rec) -> bytes:
        body = server.render(rec, t)
        if as_table:
            # kubectl get -w: each event carries a one-row Table (column definitions included every time;
            # kubectl prints the header once as long as they do not change).
            body = orjson.dumps(printing.table(rt, t.version, [orjson.loads(body)], {"resourceVersion": str(rec.rv)},
                                               include_object))
        elif body is rec.raw:
            # The stored bytes as they are: one line per event for every watch that sends it (the real
            # server also serializes an event once for all its watchers).
            last = server.last_watch_line
            if last[0] is rec and last[1] == etype:
                return last[2]
            out = b'{"type":"' + etype.encode() + b'","object":' + body + b"}\n"
            server.last_watch_line = (rec, etype, out)
            return out
        return b'{"type":"' + etype.encode() + b'","object":' + body + b"}\n"

    def on_event(etype: str, res: str, rec: Rec, old: Rec | None) -> None:
        now_ok = wanted(rec)
        if etype == "MODIFIED" and (lreq or freq):
            was_ok = wanted(old)
            if now_ok and not was_ok:
                etype = "ADDED"
            elif was_ok and not now_ok:
                etype, now_ok = "DELETED", True
        if now_ok:
            queue.put_nowait(line(etype, rec))

    resp = StreamResponse(headers={"Content-Type": JSON, "Cache-Control": "no-cache, private"})
    resp.enable_chunked_encoding()
    initial: list[bytes] = []
    # Subscribe and read the starting state in one synchronous step, so no event falls in between.
    if rv_param in ("", "0") or send_initial:
        initial = [line("ADDED", r) for r in store.list_recs(rt.key, ns) if wanted(r)]
        if send_initial and bookmarks:
            initial.append(bookmark(rt, store.rv, initial_end=True))
    else:
        try:
            since = int(rv_param)
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid resource version: {rv_param}") from None
        events = store.events_since(since)
        if events is None:
            gone = ApiError(410, "Expired", f"too old resource version: {since} ({store.compacted + 1})")
            await resp.prepare(request)
            await resp.write(b'{"type":"ERROR","object":' + orjson.dumps(gone.status()) + b"}\n")
            await resp.write_eof()
            return resp
        for _rv, etype, _res, rec, old in events:
            if _res == rt.key:
                on_event(etype, _res, rec, old)
    unsub = store.subscribe_raw(on_event, rt.key)
    watcher = Watcher(queue, request.transport)
    server.watchers.add(watcher)
    deadline = time.monotonic() + timeout
    last_bookmark = time.monotonic()
    try:
        await resp.prepare(request)
        if initial:
            await resp.write(b"".join(initial))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            wait = min(left, server.bookmark_seconds) if bookmarks else left
            items = await queue.take(wait)
            if not items:
                if bookmarks and time.monotonic() - last_bookmark >= server.bookmark_seconds * 0.99:
                    await resp.write(bookmark(rt, store.rv))
                    last_bookmark = time.monotonic()
                continue
            if None in items:  # the watch is being cut: what came before still goes out
                items = items[:items.index(None)]
                if items:
                    await resp.write(b"".join(items))  # type: ignore[arg-type]
                break
            await resp.write(b"".join(items))  # type: ignore[arg-type]
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError, RuntimeError):
        pass
    finally:
        unsub()
        queue.close()
        server.watchers.discard(watcher)
    return resp


def bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return orjson.dumps({"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version(),
                                                        "metadata": meta}}) + b"\n"
