"""``GET pods/{name}/log``: the API server's log subresource and the kubelet's log reader behind it.

The API server's part: PodLogOptions checked with upstream's wording (422 ``PodLogOptions "p" is invalid``),
the container chosen (the only one, or 400 naming the ones to choose from; 400 for a name the pod does not
have), an unscheduled pod answered with an empty log. The kubelet's part: the container's status decides which
start is read (``previous``: the last terminated one; a running one; a terminated one; during a restart
back-off the last terminated one; a container still waiting is a 400 saying why), then ``sinceSeconds`` /
``sinceTime``, ``tailLines``, ``timestamps`` (RFC 3339 with nine fraction digits and a space before the line)
and ``limitBytes`` (the output cut at exactly that many bytes) apply, and ``follow`` keeps the answer open,
writing each line when the container prints it, until the container exits, the pod goes away or the client
leaves. The lines come from ``kubesim.sim.logs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from kubesim.errors import ApiError, not_found
from kubesim.httpserver import Request, Response, StreamResponse
from kubesim.sim.logs import ContainerLog, LogBook, stamp

BATCH = 64 * 1024
"""Bytes written to the connection at once while catching up."""
RECHECK = 1.0
"""Seconds a follow waits at most before it checks that its client is still there."""


def _bad(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _flag(q: Mapping[str, str], key: str) -> bool:
    return q.get(key, "false").lower() in ("true", "1", "t")


def _int(q: Mapping[str, str], key: str) -> int | None:
    raw = q.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise _bad(f'strconv.ParseInt: parsing "{unquote(raw)}": invalid syntax') from None


def _options(q: Mapping[str, str], name: str) -> dict[str, Any]:
    tail, limit, since = _int(q, "tailLines"), _int(q, "limitBytes"), _int(q, "sinceSeconds")
    since_time: float | None = None
    raw_time = q.get("sinceTime")
    if raw_time:
        text = unquote(raw_time)
        try:
            since_time = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise _bad(f'parsing time "{text}" as "2006-01-02T15:04:05Z07:00": cannot parse "{text}" as '
                       '"2006"') from None
    errors: list[tuple[str, str, str]] = []   # (field, type, detail)
    if tail is not None and tail < 0:
        errors.append(("tailLines", "FieldValueInvalid", f"Invalid value: {tail}: must be greater than or equal to 0"))
    if limit is not None and limit < 1:
        errors.append(("limitBytes", "FieldValueInvalid", f"Invalid value: {limit}: must be greater than 0"))
    if since is not None and since_time is not None:
        errors.append(("", "FieldValueForbidden", "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be "
                       "specified"))
    elif since is not None and since < 1:
        errors.append(("sinceSeconds", "FieldValueInvalid", f"Invalid value: {since}: must be greater than 0"))
    if errors:
        texts = [f"{f}: {d}" for f, _, d in errors]
        text = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        causes = [{"reason": r, "message": d, **({"field": f} if f else {})} for f, r, d in errors]
        raise ApiError(422, "Invalid", f'PodLogOptions "{name}" is invalid: {text}',
                       {"name": name, "kind": "PodLogOptions", "causes": causes})
    if since is not None:
        since_time = time.time() - since
    return {"container": unquote(q.get("container", "")), "follow": _flag(q, "follow"),
            "previous": _flag(q, "previous"), "timestamps": _flag(q, "timestamps"), "tail": tail,
            "limit": limit, "since": since_time}


def _container(pod: Mapping[str, Any], wanted: str, name: str) -> str:
    spec = pod.get("spec") or {}
    names = [str(c.get("name")) for c in spec.get("containers") or ()]
    inits = [str(c.get("name")) for c in spec.get("initContainers") or ()]
    ephemeral = [str(c.get("name")) for c in spec.get("ephemeralContainers") or ()]
    if not wanted:
        if len(names) == 1:
            return names[0]
        if not names:
            raise _bad(f"a container name must be specified for pod {name}")
        text = f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
        if inits:
            text += f" or one of the init containers: [{' '.join(inits)}]"
        if ephemeral:
            text += f" or one of the ephemeral containers: [{' '.join(ephemeral)}]"
        raise _bad(text)
    if wanted not in names + inits + ephemeral:
        raise _bad(f"container {wanted} is not valid for pod {name}")
    return wanted


def _container_id(pod: Mapping[str, Any], container: str, previous: bool) -> str:
    """Which start of ``container`` to read, as the kubelet's validateContainerLogStatus decides."""
    status = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name")
    found = None
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            if cs.get("name") == container:
                found = cs
                break
        if found is not None:
            break
    if found is None:
        raise _bad(f'container "{container}" in pod "{name}" is not available')
    state, last = found.get("state") or {}, (found.get("lastState") or {}).get("terminated")
    if previous:
        if not last or not last.get("containerID"):
            raise _bad(f'previous terminated container "{container}" in pod "{name}" not found')
        return str(last["containerID"])
    if "running" in state:
        return str(found.get("containerID") or "")
    terminated = state.get("terminated")
    if terminated is not None:
        cid = terminated.get("containerID") or (last or {}).get("containerID")
        if not cid:
            raise _bad(f'container "{container}" in pod "{name}" is terminated')
        return str(cid)
    if last is not None:
        if not last.get("containerID"):
            raise _bad(f'container "{container}" in pod "{name}" is terminated')
        return str(last["containerID"])
    reason = (state.get("waiting") or {}).get("reason") or ""
    if reason == "ErrImagePull":
        raise _bad(f'container "{container}" in pod "{name}" is waiting to start: image can\'t be pulled')
    if reason == "ImagePullBackOff":
        raise _bad(f'container "{container}" in pod "{name}" is waiting to start: trying and failing to pull image')
    raise _bad(f'container "{container}" in pod "{name}" is waiting to start: {reason}')


async def serve_pod_log(store: Any, logs: LogBook | None, request: Request, namespace: str,
                        name: str) -> Response | StreamResponse:
    if request.method != "GET":
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                       {})
    opts = _options(request.query, name)
    rec = store.get_rec("pods", namespace, name)
    if rec is None:
        raise not_found("pods", "", name)
    pod = rec.obj()
    container = _container(pod, opts["container"], name)
    if not (pod.get("spec") or {}).get("nodeName"):
        return Response(body=b"", content_type="text/plain")  # no host yet: an empty log
    cid = _container_id(pod, container, opts["previous"])
    log = logs.get(cid, container) if logs is not None else None
    resp = StreamResponse({"Content-Type": "text/plain"})
    await resp.prepare(request)
    try:
        if log is not None:
            await _stream(request, resp, log, opts)
        await resp.write_eof()
    except ConnectionError:
        pass  # the client left: nothing more to write
    return resp


async def _stream(request: Request, resp: StreamResponse, log: ContainerLog, opts: dict[str, Any]) -> None:
    now = time.time()
    upto = log.written(now)
    start = log.first_since(opts["since"]) if opts["since"] is not None else 0
    if opts["tail"] is not None:
        start = max(start, upto - opts["tail"])
    left: int | None = opts["limit"]
    timestamps = opts["timestamps"]
    conn = request.conn
    while True:
        buf = bytearray()
        for n in range(start, upto):
            if timestamps:
                buf += stamp(log.at(n)) + b" "
            buf += log.line(n)
            if len(buf) >= BATCH or (left is not None and len(buf) >= left):
                if left is not None:
                    buf, left = buf[:left], left - min(len(buf), left)
                await resp.write(bytes(buf))
                buf = bytearray()
                if left == 0 or conn.closed:
                    return
        if buf:
            if left is not None:
                buf, left = buf[:left], left - min(len(buf), left)
            await resp.write(bytes(buf))
            if left == 0:
                return
        start = upto
        if not opts["follow"] or conn.closed:
            return
        if log.finished is not None and log.written(time.time()) <= start:
            return
        total = log.total()
        if total is not None and start >= total:
            # every line is out: wait for the exit only
            await _wait(log.ended, RECHECK)
        else:
            await _wait(log.ended, min(max(log.at(start) - time.time(), 0.0), RECHECK))
        upto = log.written(time.time())


async def _wait(event: asyncio.Event, seconds: float) -> None:
    if event.is_set() or seconds <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
