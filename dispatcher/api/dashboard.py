"""The web dashboard: server-rendered HTML pages and a few lines of JS, served by the API's server.

Pages: Workloads (filters, live refresh every few seconds), one Workload (why it is where it is,
mkd's conditions, every placement attempt, its history), Clusters (health, cordon, capacity bars per
resource), Queues (Workloads per state, admitted requests against quota, or "queues not configured").
Nothing is loaded from elsewhere (no CDN): the page works offline. Reading needs the same token as the
API; ``/?token=T`` stores it in an HttpOnly cookie (``mkd_token``) and redirects, which is what the
demo's printed URL does. The pages read through the same query functions as the API.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dispatcher import readmodel
from dispatcher.api import routes
from dispatcher.api.auth import read_access
from dispatcher.db import admin as dbadmin
from dispatcher.states import WorkloadState
from federation.errors import Invalid

REFRESH_SECONDS = 3

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:center}
header a{color:#cfd8e6;text-decoration:none}header a.on{color:#fff;font-weight:600}
header b{font-size:16px;margin-right:12px}main{padding:16px 20px}
table{border-collapse:collapse;width:100%;background:#fff}th,td{padding:6px 8px;border-bottom:1px solid #e3e6eb;
text-align:left;vertical-align:top}th{background:#eef0f4;font-weight:600}
.state{padding:1px 6px;border-radius:8px;font-size:12px;background:#e3e6eb}
.pending{background:#fff1c2}.running,.online{background:#d5f5dd}.placed{background:#dbe9ff}
.failed,.rejected,.offline{background:#ffd9d9}.finished{background:#e6e1ff}.stale,.cordoned{background:#ffe3c2}
form.filters{display:flex;gap:8px;flex-wrap:wrap;margin-bottom:12px}form.filters input,form.filters select{padding:4px}
.bar{width:220px;height:14px;background:#e3e6eb;border-radius:3px;position:relative;display:inline-block}
.bar span{position:absolute;left:0;top:0;bottom:0;background:#4f7fd8;border-radius:3px}
.note{background:#fff;border-left:4px solid #4f7fd8;padding:8px 12px;margin:8px 0}
dl{display:grid;grid-template-columns:max-content auto;gap:4px 16px;background:#fff;padding:12px}
dt{font-weight:600}h2{margin:18px 0 8px}.muted{color:#6b7385}.name{white-space:nowrap}
"""

LIVE_JS = """
(function(){
  var box=document.getElementById('live'); if(!box) return;
  var every=parseInt(box.dataset.every||'3',10)*1000;
  function tick(){
    var url=new URL(window.location.href); url.searchParams.set('fragment','1');
    fetch(url,{credentials:'same-origin'}).then(function(r){return r.ok?r.text():null}).then(function(t){
      if(t!==null){box.innerHTML=t; var s=document.getElementById('stamp');
        if(s){s.textContent='updated '+new Date().toLocaleTimeString();}}
    }).catch(function(){}).finally(function(){setTimeout(tick,every)});
  }
  setTimeout(tick,every);
})();
"""

LOGS_JS = """
(function(){
  var box=document.getElementById('pods-logs'); if(!box) return;
  var base='/api/v1/workloads/'+box.dataset.ns+'/'+box.dataset.name;
  var pods=document.getElementById('pods'), out=document.getElementById('log'), pick=document.getElementById('log-pod'),
      follow=document.getElementById('log-follow'), note=document.getElementById('log-note'), ctl=null;
  function cell(v){var td=document.createElement('td'); td.textContent=(v===''||v===null||v===undefined)?'-':String(v); return td;}
  fetch(base+'/pods',{credentials:'same-origin'}).then(function(r){return r.json().then(function(j){return [r,j];});})
  .then(function(rj){var r=rj[0], j=rj[1];
    if(!r.ok){pods.textContent=(j.detail&&j.detail.message)||j.detail||('HTTP '+r.status); return;}
    var t=document.createElement('table'), h=document.createElement('tr');
    ['pod','role','index','phase','ready','restarts','node','why'].forEach(function(x){var th=document.createElement('th'); th.textContent=x; h.appendChild(th);});
    t.appendChild(h);
    j.pods.forEach(function(p){var tr=document.createElement('tr');
      [p.name,p.role,p.index,p.phase,p.ready,p.restarts,p.node,p.reason?(p.reason+(p.message?': '+p.message:'')):''].forEach(function(v){tr.appendChild(cell(v));});
      t.appendChild(tr); var o=document.createElement('option'); o.value=p.name; o.textContent=p.name+' ('+p.role+' '+p.index+')'; pick.appendChild(o);});
    pods.textContent=''; pods.appendChild(t);
    if(j.events.length){var e=document.createElement('table'), eh=document.createElement('tr');
      ['last','type','object','reason','message'].forEach(function(x){var th=document.createElement('th'); th.textContent=x; eh.appendChild(th);});
      e.appendChild(eh); j.events.forEach(function(v){var tr=document.createElement('tr');
        [v.last,v.type,v.object,v.reason,v.message].forEach(function(x){tr.appendChild(cell(x));}); e.appendChild(tr);});
      var title=document.createElement('h3'); title.textContent='Events on '+j.cluster; pods.appendChild(title); pods.appendChild(e);}
  }).catch(function(err){pods.textContent=String(err);});
  function load(){
    if(ctl){ctl.abort();} ctl=new AbortController(); out.textContent=''; note.textContent='reading…';
    var q=new URLSearchParams({tail:document.getElementById('log-tail').value||'500'});
    if(pick.value){q.set('pod',pick.value);} if(follow.checked){q.set('follow','true');}
    fetch(base+'/logs?'+q,{credentials:'same-origin',signal:ctl.signal}).then(function(r){
      if(!r.ok){return r.json().then(function(j){note.textContent=(j.detail&&j.detail.message)||j.detail||('HTTP '+r.status);});}
      note.textContent='pod '+r.headers.get('X-Mkd-Pod')+', container '+r.headers.get('X-Mkd-Container')+' on '+r.headers.get('X-Mkd-Cluster')+(follow.checked?' (following)':'');
      var reader=r.body.getReader(), dec=new TextDecoder();
      function more(){return reader.read().then(function(x){if(x.done){if(follow.checked){note.textContent+=' · ended';} return;}
        var atEnd=out.scrollTop+out.clientHeight>=out.scrollHeight-4; out.textContent+=dec.decode(x.value,{stream:true});
        if(atEnd){out.scrollTop=out.scrollHeight;} return more();});}
      return more();
    }).catch(function(err){if(err.name!=='AbortError'){note.textContent=String(err);}});
  }
  document.getElementById('log-load').addEventListener('click',load);
  follow.addEventListener('change',function(){if(!follow.checked&&ctl){ctl.abort(); note.textContent+=' · stopped';}});
})();
"""

FAVICON = ("<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'><rect width='16' height='16' rx='3' "
           "fill='#1d2330'/><path d='M3 12V4l5 5 5-5v8' stroke='#4f7fd8' stroke-width='2' fill='none'/></svg>")
"""The dashboard's icon (served as ``/favicon.ico``, which browsers ask for on every page)."""

STATES = tuple(s.value for s in WorkloadState)


def esc(value: Any) -> str:
    if value is None or value == "":
        return "-"
    return html.escape(str(value))


def age(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "-"
    seconds = int(max(0, (now - when).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def badge(text: str) -> str:
    return f'<span class="state {html.escape(text)}">{html.escape(text)}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, body_id: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="muted">none</td></tr>'
    ident = f' id="{body_id}"' if body_id else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody{ident}>{body}</tbody></table>"


def page(title: str, active: str, body: str) -> HTMLResponse:
    nav = "".join(f'<a href="{href}" class="{"on" if key == active else ""}">{label}</a>'
                  for key, href, label in (("workloads", "/ui/workloads", "Workloads"),
                                           ("clusters", "/ui/clusters", "Clusters"),
                                           ("queues", "/ui/queues", "Queues"),
                                           ("whatif", "/ui/whatif", "What if")))
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)} · mkd</title>"
                        f"<link rel='icon' href='/favicon.ico' type='image/svg+xml'><style>{CSS}</style></head><body><header><b>mkd</b>{nav}"
                        f"<span class='muted' id='stamp'></span></header><main>{body}</main>"
                        f"<script>{LIVE_JS}</script></body></html>")


def _with_token(request: Request) -> Response | None:
    """``?token=T`` on any page: store it in the cookie and open the same page without it in the URL."""
    token = request.query_params.get("token")
    if not token:
        return None
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    target = request.url.path + ("?" + urlencode(rest) if rest else "")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie("mkd_token", token, httponly=True, samesite="strict")
    return response


async def _reader(request: Request, namespace: str = "") -> None:
    user = await routes.authenticated(request)
    await routes.allow(request, user, read_access(namespace))


def login_page(message: str) -> HTMLResponse:
    body = (f"<h2>Sign in</h2><p class='note'>{html.escape(message)}</p><form method='get' action='/'>"
            "<input name='token' type='password' placeholder='bearer token' size='50'> <button>open</button></form>")
    response = page("sign in", "", body)
    response.status_code = 401
    return response


# --- pages ------------------------------------------------------------------------------------------


async def workloads_page(request: Request) -> Response:
    params = request.query_params
    values = {k: params.get(k) or "" for k in ("namespace", "kind", "queue", "cluster", "state", "label")}
    if (redirect := _with_token(request)) is not None:
        return redirect
    try:
        await _reader(request, values["namespace"])
    except HTTPException as exc:
        return login_page(str(exc.detail))
    error = ""
    f: dbadmin.WorkloadFilter | None = None
    try:
        f = dbadmin.WorkloadFilter(namespace=values["namespace"] or None,
                                   kind=dbadmin.parse_kind(values["kind"], field_name="kind"),
                                   queue=values["queue"] or None, cluster=values["cluster"] or None,
                                   state=dbadmin.parse_state(values["state"], field_name="state"),
                                   labels=dbadmin.parse_labels(values["label"], field_name="label"))
    except Invalid as exc:
        error = exc.message  # shown above an empty table
    rows: list[dict[str, Any]] = []
    if f is not None:
        async with routes.ctx_of(request).sessions() as s:
            rows = await readmodel.workloads(s, f, limit=1000)
    now = datetime.now(UTC)
    body_rows = [(
        esc(r["namespace"]),
        f'<a href="/ui/workloads/{html.escape(r["namespace"])}/{html.escape(r["name"])}">{esc(r["name"])}</a>',
        esc(r["kind"]), esc(r["queue"]), esc(r["cluster"]), badge(r["state"]), esc(r["reason"]),
        esc(r["attempt"]), age(r["created_at"], now)) for r in rows]
    rendered = table(("namespace", "job", "kind", "queue", "cluster", "state", "reason", "attempt", "age"),
                     body_rows, body_id="workload-rows")
    counts = f"<p class='muted' id='count'>{len(rows)} workload(s)</p>"
    if params.get("fragment"):
        return HTMLResponse(counts + rendered)
    options = "".join(f"<option {'selected' if values['state'] == s_ else ''}>{s_}</option>" for s_ in STATES)
    form = ("<form class='filters' method='get' action='/ui/workloads'>"
            + "".join(f"<input name='{k}' placeholder='{k}' value='{html.escape(values[k])}'>"
                      for k in ("namespace", "kind", "queue", "cluster"))
            + f"<select name='state'><option value=''>any state</option>{options}</select>"
            + f"<input name='label' placeholder='label key=value' value='{html.escape(values['label'])}'>"
            + "<button>filter</button></form>")
    note = f"<p class='note' id='error'>{html.escape(error)}</p>" if error else ""
    live = f"<div id='live' data-every='{REFRESH_SECONDS}'>{counts}{rendered}</div>"
    return page("Workloads", "workloads", f"<h2>Workloads</h2>{form}{note}{live}")


async def workload_page(request: Request, namespace: str, name: str) -> Response:
    if (redirect := _with_token(request)) is not None:
        return redirect
    try:
        await _reader(request, namespace)
    except HTTPException as exc:
        return login_page(str(exc.detail))
    ctx = routes.ctx_of(request)
    async with ctx.sessions() as s:
        w = await readmodel.workload(s, f"{namespace}/{name}", ctx.kube)
    if w is None:
        message = await readmodel.unclaimed(ctx.kube, namespace, name) or f"no workload {namespace}/{name}"
        response = page(name, "workloads", f"<h2>{html.escape(namespace)}/{html.escape(name)}</h2>"
                                           f"<p class='note' id='why'>{html.escape(message)}</p>")
        response.status_code = 404
        return response
    why = w["why"]
    held = why["step"] if w["state"] == "pending" else None
    where = "".join(f" · {label} {value}" for label, value in (
        ("held at step", held), ("ClusterQueue", why["cluster_queue"]),
        ("position in ClusterQueue", why["position_in_cluster_queue"]),
        ("in LocalQueue", why["position_in_local_queue"])) if value)
    details = "".join(f"<li>{html.escape(d)}</li>" for d in why["details"])
    now = datetime.now(UTC)
    facts = {"kind": esc(w["kind"]), "queue": esc(f"{w['namespace']}/{w['queue']}"), "state": badge(w["state"]),
             "cluster": esc(w["cluster"]), "attempt": esc(w["attempt"]), "pinned": esc(w.get("pinned")),
             "suspended": "yes" if w["suspended"] else "no",
             "requests": esc(", ".join(f"{k}={v}" for k, v in (w["requests"] or {}).items())),
             "excluded": esc(", ".join(w["excluded"] or [])), "created": age(w["created_at"], now) + " ago",
             "uid": esc(w["uid"])}
    dl = "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts.items()) + "</dl>"
    conditions = w["conditions"]
    if conditions is None:
        cond_table = "<p class='note' id='conditions'>the manager cluster could not be read</p>"
    else:
        cond_table = table(("type", "status", "reason", "message", "changed"),
                           [(esc(c.get("type")), esc(c.get("status")), esc(c.get("reason")), esc(c.get("message")),
                             f"<span class='name'>{esc(c.get('lastTransitionTime'))}</span>") for c in conditions],
                           body_id="condition-rows")
    placements = w["placements"]
    p_table = table(("attempt", "cluster", "state", "reason", "created", "accepted", "finished"),
                    [(esc(p["attempt"]), esc(p["cluster"]), badge(p["state"]), esc(p["reason"]),
                      age(p["created_at"], now), age(p["accepted_at"], now), age(p["finished_at"], now))
                     for p in placements], body_id="placement-rows")
    e_table = table(("age", "type", "cluster", "reason", "message"),
                    [(age(e["at"], now), esc(e["type"]), esc(e["cluster"]), esc(e["reason"]), esc(e["message"]))
                     for e in w["events"]], body_id="event-rows")
    logs = ""
    if w["cluster"]:  # the pods and logs are read on the worker through the API (the same RBAC checks)
        logs = (f"<h2>Pods and logs</h2><div id='pods-logs' data-ns='{esc(namespace)}' data-name='{esc(name)}'>"
                "<div id='pods' class='muted'>reading the pods on their cluster…</div>"
                "<p><select id='log-pod'><option value=''>default pod (lead role)</option></select> "
                "tail <input id='log-tail' size='5' value='500'> "
                "<label><input type='checkbox' id='log-follow'> follow</label> "
                "<button id='log-load'>show log</button> <span id='log-note' class='muted'></span></p>"
                "<pre id='log' style='max-height:480px;overflow:auto;background:#1d2330;color:#e3e6eb;"
                f"padding:8px'></pre></div><script>{LOGS_JS}</script>")
    body = (f"<h2>{html.escape(namespace)}/{html.escape(name)}</h2>"
            f"<div class='note' id='why'><b>why {html.escape(why['state'])}:</b> {html.escape(why['answer'])}"
            f"<span class='muted'>{html.escape(where)}</span>"
            + (f"<ul id='why-details'>{details}</ul>" if details else "") + f"</div>{dl}"
            f"<h2>Conditions</h2>{cond_table}<h2>Placements</h2>{p_table}{logs}<h2>History</h2>{e_table}")
    return page(f"{namespace}/{name}", "workloads", body)


def _bar(used: Decimal, total: Decimal) -> str:
    share = float(used / total) if total > 0 else 0.0
    return f"<span class='bar' title='{share:.0%}'><span style='width:{min(100.0, share * 100):.1f}%'></span></span>"


async def clusters_page(request: Request) -> Response:
    if (redirect := _with_token(request)) is not None:
        return redirect
    try:
        await _reader(request)
    except HTTPException as exc:
        return login_page(str(exc.detail))
    from federation.podset import parse_quantity

    async with routes.ctx_of(request).sessions() as s:
        items = await readmodel.clusters(s)
    now = datetime.now(UTC)
    out = []
    for item in items:
        bars = []
        for resource in sorted(item["allocatable"]):
            try:
                total = parse_quantity(item["allocatable"][resource], resource)
                used = parse_quantity(item["used"].get(resource, "0"), resource)
            except (ValueError, Invalid, ArithmeticError):
                continue
            bars.append(f"<div class='cap' data-resource='{html.escape(resource)}'>{_bar(used, total)} "
                        f"{html.escape(resource)}: {html.escape(item['used'].get(resource, '0'))} used of "
                        f"{html.escape(item['allocatable'][resource])}</div>")
        health = badge(item["health"]) + (" " + badge("cordoned") if item["cordoned"] else "")
        if item["refused"]:
            health += f" <span class='muted'>{esc(item['refused'])}</span>"
        out.append((f"<b class='name'>{esc(item['name'])}</b>", health, age(item["last_heartbeat"], now),
                    esc(item["running"]), "".join(bars) or "-",
                    esc(", ".join(f"{k}={v}" for k, v in item["labels"].items()))))
    rendered = table(("cluster", "health", "heartbeat", "running", "capacity", "labels"), out, body_id="cluster-rows")
    if request.query_params.get("fragment"):
        return HTMLResponse(rendered)
    return page("Clusters", "clusters", f"<h2>Clusters</h2><div id='live' data-every='{REFRESH_SECONDS}'>"
                                        f"{rendered}</div>")


async def queues_page(request: Request) -> Response:
    if (redirect := _with_token(request)) is not None:
        return redirect
    try:
        await _reader(request)
    except HTTPException as exc:
        return login_page(str(exc.detail))
    ctx = routes.ctx_of(request)
    async with ctx.sessions() as s:
        queues = await readmodel.queues(s, ctx.kube)
    note = ""
    if queues["source"] == "records":
        note = ("<p class='note' id='not-read'>The manager cluster could not be read: only the queues Workloads "
                "were recorded in are shown.</p>")
    elif not queues["configured"]:
        note = ("<p class='note' id='not-configured'>Queues not configured: no ClusterQueue exists, so Workloads are "
                "placed in arrival order without quota. The LocalQueues below are the ones Jobs name "
                "(kueue.x-k8s.io/queue-name).</p>")
    from federation.podset import parse_quantity

    rows = []
    for q in queues["local_queues"]:
        usage = ", ".join(f"{k}={v}" for k, v in q["requests_admitted"].items())
        rows.append((f"<b class='name'>{esc(q['namespace'])}/{esc(q['name'])}</b>", esc(q["cluster_queue"]),
                     " ".join(f"{badge(k)} {v}" for k, v in sorted(q["workloads"].items())) or "-", esc(usage)))
    rendered = table(("local queue", "cluster queue", "workloads", "admitted requests"), rows, body_id="queue-rows")
    cq_rows = []
    for cq in queues["cluster_queues"]:
        bars = []
        for key, total in cq["quota"].items():
            resource = key.split("/", 1)[1]
            used = cq["usage"].get(key, "0")
            try:
                share = _bar(parse_quantity(used, resource), parse_quantity(total, resource))
            except (ValueError, Invalid, ArithmeticError):
                share = ""
            bars.append(f"<div class='cap' data-resource='{html.escape(key)}'>{share} {html.escape(key)}: "
                        f"{html.escape(used)} of {html.escape(total)}</div>")
        if cq.get("problem"):
            bars.append(f"<div class='muted'>{esc(cq['problem'])}</div>")
        cq_rows.append((f"<b class='name'>{esc(cq['name'])}</b>", esc(cq["cohort"]), esc(cq["pending"]),
                        esc(cq["admitted"]), "".join(bars) or "-"))
    cq_table = (f"<h2>ClusterQueues</h2>{table(('cluster queue', 'cohort', 'pending', 'admitted', 'usage against quota'), cq_rows, body_id='cluster-queue-rows')}"
                if queues["cluster_queues"] else "")
    return page("Queues", "queues", f"<h2>Queues</h2>{note}{cq_table}<h2>LocalQueues</h2>{rendered}")


def register(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def root(request: Request) -> Response:
        token = request.query_params.get("token")
        response = RedirectResponse("/ui/workloads", status_code=303)
        if token:
            response.set_cookie("mkd_token", token, httponly=True, samesite="strict")
        return response

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    app.get("/ui/workloads", include_in_schema=False)(workloads_page)
    app.get("/ui/workloads/{namespace}/{name}", include_in_schema=False)(workload_page)
    app.get("/ui/clusters", include_in_schema=False)(clusters_page)
    app.get("/ui/queues", include_in_schema=False)(queues_page)
