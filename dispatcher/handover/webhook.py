"""The mutating admission webhook that routes new Jobs to mkd by HandoverPolicy.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from dispatcher.handover.policy import Decision
from federation import labels
from federation.kinds.base import JobKind

log = logging.getLogger(__name__)

Decide = Callable[[str, str, str, Mapping[str, str]], Decision]


def _pointer(path: Iterable[str]) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path)


def review(request: Mapping[str, Any], kinds: Mapping[tuple[str, str], JobKind], decide: Decide,
           routed: Callable[[str, Decision], None] | None = None) -> dict[str, Any]:
    """The AdmissionReview ``response`` for one ``request`` (pure, for tests and the server).

    Served by the dispatcher over HTTPS (``handover.webhook_port``, certificate and key from files mounted
    from a Secret) at ``/mutate``; ``deploy/components/handover-webhook`` registers it for CREATE of every
    supported kind with ``failurePolicy: Ignore``, so a dispatcher that is down never blocks a user's Job
    (that Job then stays with its own controller). The answer is an AdmissionReview v1:

    - CREATE of a supported kind whose managedBy the user left unset, that a ``Route`` policy takes
      (:func:`dispatcher.handover.policy.decide`): allowed, with a JSONPatch setting managedBy to
      ``kueue.x-k8s.io/multikueue`` and a warning naming the policy;
    - anything else, an explicit managedBy above all: allowed unchanged. A user who chose a controller
      always wins, and the webhook never refuses a Job.

    One exception: a CRD whose schema defaults managedBy (TrainJob's, to
    ``trainer.kubeflow.org/trainjob-controller``) has it filled in while the request is decoded, before any
    admission webhook runs, so an explicit trainjob-controller cannot be told from an omitted one. For such
    kinds (``JobKind.defaulted_by_crd``) the default value counts as unset; keep such Jobs out of a Route policy
    with its ``jobSelector``.
    """
    uid = str(request.get("uid", ""))
    answer: dict[str, Any] = {"uid": uid, "allowed": True}
    if request.get("operation") != "CREATE":
        return answer
    group = str((request.get("kind") or {}).get("group", ""))
    kind = kinds.get((group, str((request.get("kind") or {}).get("kind", ""))))
    obj = request.get("object")
    if kind is None or not isinstance(obj, Mapping):
        return answer
    chosen = kind.managed_by(obj)
    if chosen and not (kind.defaulted_by_crd and chosen == kind.controller):
        return answer  # the user chose a controller: theirs wins
    meta = obj.get("metadata") or {}
    namespace = str(request.get("namespace") or meta.get("namespace") or "")
    name = str(meta.get("name") or request.get("name") or "")
    if not name:
        return answer  # generateName: no stable share before the name exists; left to its controller
    job_labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    decision = decide(kind.name, namespace, name, job_labels)
    if not decision.route:
        return answer
    ops: list[dict[str, Any]] = []
    node: Any = obj
    path = kind.managed_by_path
    for depth, part in enumerate(path[:-1]):  # create the parents the user left out (spec.runPolicy)
        node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            ops.append({"op": "add", "path": _pointer(path[:depth + 1]), "value": {}})
            node = {}
    # "add" replaces a member that exists (a CRD's default), and creates it otherwise
    ops.append({"op": "add", "path": _pointer(path), "value": labels.MULTIKUEUE})
    answer.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(ops).encode()).decode(),
                  warnings=[f"managedBy set to {labels.MULTIKUEUE} by mkd: {decision.reason}"])
    if routed is not None:
        routed(kind.name, decision)
    return answer


def create_app(kinds: Iterable[JobKind], decide: Decide,
               routed: Callable[[str, Decision], None] | None = None) -> Starlette:
    by_gk = {(k.group, k.name): k for k in kinds}

    async def mutate(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            req = body["request"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "expected an AdmissionReview v1 with a request"}, status_code=400)
        try:
            answer = review(req, by_gk, decide, routed)
        except Exception:  # never fail a user's create because of mkd: allow it unchanged, say why in the log
            log.exception("handover webhook: could not decide %s; allowed unchanged", req.get("uid"))
            answer = {"uid": req.get("uid", ""), "allowed": True}
        return JSONResponse({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer})

    async def healthz(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/mutate", mutate, methods=["POST"]), Route("/healthz", healthz)])
