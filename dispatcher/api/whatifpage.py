"""The dashboard's What-if page: the live configuration against an uploaded change, on the last week's history.

``GET /ui/whatif`` shows a form: a YAML file (or text) of objects that replace those of the same kind and name
in the live configuration (a ClusterQueue with more quota, a WhatIfSettings with fair sharing, a WorkerCluster
cordoned), and how far back the history goes (``7d``). ``POST`` replays that history against both
(:mod:`dispatcher.whatif.service`, the code behind ``POST /api/v1/whatif``) and shows the comparison with the
two plots side by side. Reading needs the API's token, as every page.
"""

from __future__ import annotations

import html
from urllib.parse import parse_qs

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response

from dispatcher.api import dashboard, routes
from dispatcher.whatif import service
from federation.errors import Invalid

EXAMPLE = """# e.g. team-b gets 8 more GPUs of its own:
# apiVersion: kueue.x-k8s.io/v1beta2
# kind: ClusterQueue
# metadata: {name: team-b}
# spec: ...
"""
UPLOAD_JS = """
document.getElementById('file').addEventListener('change', async (ev) => {
  const f = ev.target.files[0]; if (f) document.getElementById('compare').value = await f.text();
});
"""


def form(compare: str, since: str) -> str:
    return (f"<form method='post' action='/ui/whatif' id='whatif-form'>"
            f"<p>Objects that replace the live ones of the same kind and name (Kueue's ClusterQueue, Cohort, "
            f"LocalQueue, ResourceFlavor, WorkloadPriorityClass; WhatIfSettings; WorkerCluster): "
            f"<input type='file' id='file' accept='.yaml,.yml,.json'></p>"
            f"<textarea name='compare' id='compare' rows='14' cols='100'>{html.escape(compare or EXAMPLE)}</textarea>"
            f"<p>History of the last <input name='since' value='{html.escape(since)}' size='6'> "
            f"<button type='submit'>Compare</button></p></form><script>{UPLOAD_JS}</script>")


async def whatif_page(request: Request) -> Response:
    if (redirect := dashboard._with_token(request)) is not None:
        return redirect
    try:
        await dashboard._reader(request)
    except HTTPException as exc:
        return dashboard.login_page(str(exc.detail))
    compare, since, result = "", "7d", ""
    if request.method == "POST":
        fields = parse_qs((await request.body()).decode(), keep_blank_values=True)
        compare = (fields.get("compare") or [""])[0]
        since = (fields.get("since") or ["7d"])[0].strip() or "7d"
        ctx = routes.ctx_of(request)
        try:
            changed = compare if any(line.strip() and not line.lstrip().startswith("#")
                                     for line in compare.splitlines()) else None
            if changed is None:
                raise Invalid("compare", "is empty", fix="upload or paste the objects to change")
            async with ctx.sessions() as s:
                got = await service.answer(s, ctx.kube, since=service.parse_since(since, field="since"),
                                           compare=changed, plot=True)
            result = (f"<h2>Live configuration → with the change</h2><pre id='comparison'>{html.escape(got['text'])}"
                      f"</pre><img id='plots' alt='pending Workloads per ClusterQueue and use per cluster, live and "
                      f"with the change' style='max-width:100%' src='data:image/png;base64,{got['plot']}'>")
        except Invalid as exc:
            result = f"<p class='note' id='error'>{html.escape(exc.message)}</p>"
    body = ("<h2>What if</h2><p class='muted'>Replays the dispatcher's history through its own scheduler against "
            "the live configuration and against it with your change, side by side.</p>" + form(compare, since) + result)
    return dashboard.page("What if", "whatif", body)


def register(app: FastAPI) -> None:
    app.get("/ui/whatif", include_in_schema=False)(whatif_page)
    app.post("/ui/whatif", include_in_schema=False)(whatif_page)
