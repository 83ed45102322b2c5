"""Server-side printing: the ``meta.k8s.io/v1`` Table a real API server returns for
``Accept: application/json;as=Table;g=meta.k8s.io;v=v1`` (what ``kubectl get`` asks for).

Custom resources get their CRD version's ``additionalPrinterColumns`` (JSONPath cells typed as declared;
``date`` cells as a human-readable age; ``Age`` alone when a CRD declares none), as apiextensions-apiserver's
tableconvertor does. Built-in kinds get the columns of pkg/printers/internalversion/printers.go (pods:
Ready/Status/Restarts/Age, jobs: Status/Completions/Duration/Age, services, nodes, namespaces, configmaps,
secrets, serviceaccounts, events, leases, the admissionregistration kinds); any other kind gets the default
Name / Created At table.
``includeObject`` (``None`` | ``Metadata``, the default | ``Object``) says what each row carries.
"""

from __future__ import annotations

import re
import time
from calendar import timegm
from collections.abc import Callable
from typing import Any

from kubesim.resources import ResourceType

NAME_DESC = ("Name must be unique within a namespace. Is required when creating resources, although some resources "
             "may allow a client to request the generation of an appropriate name automatically. Name is primarily "
             "intended for creation idempotence and configuration definition. Cannot be updated. More info: "
             "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
AGE_DESC = ("CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
            "guaranteed to be set in happens-before order across separate operations. Clients may not set this "
            "value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null "
            "for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/"
            "api-conventions.md#metadata")

Row = list[Any]


def col(name: str, typ: str = "string", desc: str = "", priority: int = 0, fmt: str = "") -> dict[str, Any]:
    return {"name": name, "type": typ, "format": fmt, "description": desc, "priority": priority}


NAME_COL = col("Name", "string", NAME_DESC, fmt="name")
AGE_COL = col("Age", "string", AGE_DESC)


# ------------------------------------------------------------------ time helpers

def _epoch(ts: Any) -> float | None:
    if not isinstance(ts, str) or len(ts) < 20:
        return None
    try:
        return float(timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = (s % 3600) // 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def age(ts: Any, now: float) -> str:
    t = _epoch(ts)
    return "<unknown>" if t is None else human_duration(now - t)


# ------------------------------------------------------------------ JSONPath (the subset printer columns use)

_TOKEN = re.compile(r"\.(?:\\.|[^.\[])+|\[[^\]]*\]")


def _steps(path: str) -> list[str]:
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    if not path.startswith(".") and not path.startswith("["):
        path = "." + path
    return _TOKEN.findall(path)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Values at ``path``: fields, ``[n]``, ``[a:b]`` (``[-1:]``), ``[*]``, ``['key']`` and
    ``[?(@.field=="value")]`` filters, like client-go's jsonpath for printer columns."""
    values = [obj]
    for step in _steps(path):
        nxt: list[Any] = []
        if step.startswith("."):
            key = step[1:].replace("\\.", ".")
            for v in values:
                if key == "*" and isinstance(v, dict):
                    nxt.extend(v.values())
                elif isinstance(v, dict) and key in v:
                    nxt.append(v[key])
        else:
            inner = step[1:-1].strip()
            for v in values:
                nxt.extend(_index(v, inner))
        values = nxt
    return values


def _index(v: Any, inner: str) -> list[Any]:
    if inner.startswith("'") or inner.startswith('"'):
        key = inner.strip("'\"")
        return [v[key]] if isinstance(v, dict) and key in v else []
    if not isinstance(v, list):
        return list(v.values()) if inner == "*" and isinstance(v, dict) else []
    if inner == "*":
        return list(v)
    if inner.startswith("?(") and inner.endswith(")"):
        m = re.fullmatch(r"\?\(@\.([\w.-]+)\s*(==|!=)\s*['\"]?([^'\"]*)['\"]?\)", inner)
        if not m:
            return []
        fld, op, want = m.groups()
        out = []
        for item in v:
            got = jsonpath(item, "." + fld)
            hit = bool(got) and str(_plain(got[0])) == want
            if (op == "==") == hit:
                out.append(item)
        return out
    if ":" in inner:
        a, _, b = inner.partition(":")
        start = int(a) if a.strip() else None
        end = int(b) if b.strip() else None
        return v[start:end]
    try:
        i = int(inner)
    except ValueError:
        return []
    return [v[i]] if -len(v) <= i < len(v) else []


def _plain(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v


def _go_text(v: Any) -> str:
    """How client-go's jsonpath prints a value (%v): maps as map[k:v], lists as [a b]."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_text(x)}" for k, x in sorted(v.items())) + "]"
    if isinstance(v, list):
        return "[" + " ".join(_go_text(x) for x in v) + "]"
    return str(v)


def crd_cell(typ: str, values: list[Any], now: float) -> Any:
    """apiextensions tableconvertor's cell for one additional printer column."""
    if not values:
        return None
    value = values[0]
    if typ == "string":
        return _go_text(value)
    if value is None:
        return None
    if typ == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if typ == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if typ == "boolean" and isinstance(value, bool):
        return value
    if typ == "date" and isinstance(value, str):
        return "<invalid>" if _epoch(value) is None else age(value, now)
    return None


# ------------------------------------------------------------------ built-in printers

def _cond(status: dict[str, Any], ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True" for c in status.get("conditions") or ())


def _pod(o: dict[str, Any], now: float) -> Row:
    spec, st, meta = o.get("spec") or {}, o.get("status") or {}, o["metadata"]
    total = len(spec.get("containers") or ())
    restarts, ready, last_restart = 0, 0, 0.0
    reason = st.get("reason") or st.get("phase") or ""
    for c in st.get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    initializing = False
    inits = st.get("initContainerStatuses") or []
    for i, cs in enumerate(inits):
        restarts += int(cs.get("restartCount") or 0)
        state = cs.get("state") or {}
        term = state.get("terminated")
        if term and term.get("exitCode") == 0:
            continue
        if term:
            reason = "Init:" + (term.get("reason") or (f"Signal:{term['signal']}" if term.get("signal")
                                                       else f"ExitCode:{term.get('exitCode')}"))
        elif (state.get("waiting") or {}).get("reason") not in (None, "", "PodInitializing"):
            reason = "Init:" + state["waiting"]["reason"]
        else:
            reason = f"Init:{i}/{len(spec.get('initContainers') or ())}"
        initializing = True
        break
    if not initializing:
        has_running = False
        for cs in reversed(st.get("containerStatuses") or []):
            restarts += int(cs.get("restartCount") or 0)
            lt = _epoch(((cs.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
            if lt:
                last_restart = max(last_restart, lt)
            state = cs.get("state") or {}
            if (state.get("waiting") or {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif state.get("terminated"):
                term = state["terminated"]
                reason = term.get("reason") or (f"Signal:{term['signal']}" if term.get("signal")
                                                else f"ExitCode:{term.get('exitCode')}")
            elif cs.get("ready") and state.get("running"):
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            reason = "Running" if _cond(st, "Ready") else "NotReady"
    if meta.get("deletionTimestamp"):
        reason = "Unknown" if st.get("reason") == "NodeLost" else "Terminating"
    shown_restarts = f"{restarts} ({human_duration(now - last_restart)} ago)" if last_restart and restarts \
        else str(restarts)
    node = spec.get("nodeName") or "<none>"
    ip = st.get("podIP") or "<none>"
    nominated = st.get("nominatedNodeName") or "<none>"
    gates = spec.get("readinessGates") or []
    gate_text = "<none>"
    if gates:
        true = sum(1 for g in gates if _cond(st, g.get("conditionType", "")))
        gate_text = f"{true}/{len(gates)}"
    return [meta["name"], f"{ready}/{total}", reason, shown_restarts, age(meta.get("creationTimestamp"), now),
            ip, node, nominated, gate_text]


POD_COLS = [NAME_COL, col("Ready", desc="The aggregate readiness state of this pod for accepting traffic."),
            col("Status", desc="The aggregate status of the containers in this pod."),
            col("Restarts", desc="The number of times the containers in this pod have been restarted and when the "
                "last container in this pod has restarted."), AGE_COL,
            col("IP", desc="podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet "
                "allocated.", priority=1),
            col("Node", desc="NodeName indicates in which node this pod is scheduled.", priority=1),
            col("Nominated Node", desc="nominatedNodeName is set when this pod preempts other pods on the node, but "
                "it cannot be scheduled right away as preemption victims receive their graceful termination "
                "periods.", priority=1),
            col("Readiness Gates", desc="If specified, all readiness gates will be evaluated for pod readiness.",
                priority=1)]


def _containers(spec: dict[str, Any]) -> tuple[str, str]:
    cs = (((spec.get("template") or {}).get("spec")) or {}).get("containers") or []
    return ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs)


def _selector(sel: Any) -> str:
    if not isinstance(sel, dict):
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        vals = ",".join(e.get("values") or [])
        op = e.get("operator")
        parts.append(f"{e.get('key')} {op.lower()} ({vals})" if op in ("In", "NotIn")
                     else (e.get("key") if op == "Exists" else f"!{e.get('key')}"))
    return ",".join(parts) or "<none>"


def _job(o: dict[str, Any], now: float) -> Row:
    spec, st, meta = o.get("spec") or {}, o.get("status") or {}, o["metadata"]
    if _cond(st, "Complete"):
        status = "Complete"
    elif _cond(st, "Failed"):
        status = "Failed"
    elif meta.get("deletionTimestamp"):
        status = "Terminating"
    elif _cond(st, "Suspended"):
        status = "Suspended"
    elif _cond(st, "FailureTarget"):
        status = "FailureTarget"
    elif _cond(st, "SuccessCriteriaMet"):
        status = "SuccessCriteriaMet"
    else:
        status = "Running"
    succeeded = int(st.get("succeeded") or 0)
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{spec['completions']}"
    elif int(spec.get("parallelism") or 0) > 1:
        completions = f"{succeeded}/1 of {spec['parallelism']}"
    else:
        completions = f"{succeeded}/1"
    start, end = _epoch(st.get("startTime")), _epoch(st.get("completionTime"))
    duration = "" if start is None else human_duration((end if end is not None else now) - start)
    names, images = _containers(spec)
    return [meta["name"], status, completions, duration, age(meta.get("creationTimestamp"), now), names, images,
            _selector(spec.get("selector"))]


JOB_COLS = [NAME_COL, col("Status", desc="Status of the job."),
            col("Completions", desc="The completion status of the job."),
            col("Duration", desc="Time required to complete the job."), AGE_COL,
            col("Containers", desc="Names of each container in the template.", priority=1),
            col("Images", desc="Images referenced by each container in the template.", priority=1),
            col("Selector", desc="A label query over pods that should match the pod count. Normally, the system "
                "sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/"
                "working-with-objects/labels/#label-selectors", priority=1)]


def _service(o: dict[str, Any], now: float) -> Row:
    spec, meta = o.get("spec") or {}, o["metadata"]
    typ = spec.get("type") or "ClusterIP"
    external = ",".join(spec.get("externalIPs") or []) or ("<pending>" if typ == "LoadBalancer" else "<none>")
    if typ == "ExternalName":
        external = spec.get("externalName") or "<none>"
    ports = []
    for p in spec.get("ports") or []:
        text = f"{p.get('port')}"
        if p.get("nodePort"):
            text += f":{p['nodePort']}"
        ports.append(f"{text}/{p.get('protocol') or 'TCP'}")
    sel = spec.get("selector") or {}
    return [meta["name"], typ, spec.get("clusterIP") or "<none>", external, ",".join(ports) or "<none>",
            age(meta.get("creationTimestamp"), now),
            ",".join(f"{k}={v}" for k, v in sorted(sel.items())) or "<none>"]


SERVICE_COLS = [NAME_COL, col("Type", desc="type determines how the Service is exposed."),
                col("Cluster-IP", desc="clusterIP is the IP address of the service."),
                col("External-IP", desc="externalIPs is a list of IP addresses for which nodes in the cluster will "
                    "also accept traffic for this service."),
                col("Port(s)", desc="The list of ports that are exposed by this service."), AGE_COL,
                col("Selector", desc="Route service traffic to pods with label keys and values matching this "
                    "selector.", priority=1)]


def _node(o: dict[str, Any], now: float) -> Row:
    spec, st, meta = o.get("spec") or {}, o.get("status") or {}, o["metadata"]
    ready = next((c for c in st.get("conditions") or () if c.get("type") == "Ready"), None)
    status = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    if spec.get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in (meta.get("labels") or {}) if k.startswith("node-role.kubernetes.io/")
                   and "/" in k)
    info = st.get("nodeInfo") or {}
    addrs = {a.get("type"): a.get("address") for a in st.get("addresses") or ()}
    return [meta["name"], status, ",".join(roles) or "<none>", age(meta.get("creationTimestamp"), now),
            info.get("kubeletVersion", ""), addrs.get("InternalIP") or "<none>", addrs.get("ExternalIP") or "<none>",
            info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>"]


NODE_COLS = [NAME_COL, col("Status", desc="The status of the node"), col("Roles", desc="The roles of the node"),
             AGE_COL, col("Version", desc="Kubelet Version reported by the node."),
             col("Internal-IP", desc="List of addresses reachable to the node.", priority=1),
             col("External-IP", desc="List of addresses reachable to the node.", priority=1),
             col("OS-Image", desc="OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 "
                 "(wheezy)).", priority=1),
             col("Kernel-Version", desc="Kernel Version reported by the node from 'uname -r' (e.g. "
                 "3.16.0-0.bpo.4-amd64).", priority=1),
             col("Container-Runtime", desc="ContainerRuntime Version reported by the node through runtime remote "
                 "API (e.g. containerd://1.4.2).", priority=1)]


def _event(o: dict[str, Any], now: float) -> Row:
    meta = o["metadata"]
    inv = o.get("involvedObject") or o.get("regarding") or {}
    last = o.get("lastTimestamp") or o.get("eventTime") or (o.get("series") or {}).get("lastObservedTime") \
        or meta.get("creationTimestamp")
    first = o.get("firstTimestamp") or o.get("eventTime") or meta.get("creationTimestamp")
    src = o.get("source") or {}
    source = src.get("component") or o.get("reportingComponent") or ""
    if src.get("host"):
        source += f", {src['host']}"
    kind = (inv.get("kind") or "").lower()
    return [age(last, now), o.get("type") or "", o.get("reason") or o.get("action") or "",
            f"{kind}/{inv.get('name', '')}", inv.get("fieldPath") or "", source, o.get("message") or o.get("note", ""),
            age(first, now), int(o.get("count") or (o.get("series") or {}).get("count") or 1), meta["name"]]


EVENT_COLS = [col("Last Seen", desc="The time at which the most recent occurrence of this event was recorded."),
              col("Type", desc="Type of this event (Normal, Warning), new types could be added in the future"),
              col("Reason", desc="This should be a short, machine understandable string that gives the reason for "
                  "the transition into the object's current status."),
              col("Object", desc="The object that this event is about."),
              col("Subobject", desc="The field path of the object this event is about.", priority=1),
              col("Source", desc="The component reporting this event. Should be a short machine understandable "
                  "string.", priority=1),
              col("Message", desc="A human-readable description of the status of this operation."),
              col("First Seen", desc="The time at which the event was first recorded. (Time of server receipt is "
                  "in TypeMeta.)", priority=1),
              col("Count", "integer", "The number of times this event has occurred.", priority=1),
              col("Name", desc=NAME_DESC, priority=1, fmt="name")]


BUILTIN: dict[str, tuple[list[dict[str, Any]], Callable[[dict[str, Any], float], Row]]] = {
    "pods": (POD_COLS, _pod),
    "jobs.batch": (JOB_COLS, _job),
    "services": (SERVICE_COLS, _service),
    "nodes": (NODE_COLS, _node),
    "events": (EVENT_COLS, _event),
    "events.events.k8s.io": (EVENT_COLS, _event),
    "namespaces": ([NAME_COL, col("Status", desc="The status of the namespace"), AGE_COL],
                   lambda o, now: [o["metadata"]["name"], (o.get("status") or {}).get("phase", ""),
                                   age(o["metadata"].get("creationTimestamp"), now)]),
    "configmaps": ([NAME_COL, col("Data", "integer", "Data contains the configuration data. Each key must consist "
                                  "of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte "
                                  "sequences must use the BinaryData field. The keys stored in Data must not "
                                  "overlap with the keys in the BinaryData field, this is enforced during "
                                  "validation process."), AGE_COL],
                   lambda o, now: [o["metadata"]["name"], len(o.get("data") or {}) + len(o.get("binaryData") or {}),
                                   age(o["metadata"].get("creationTimestamp"), now)]),
    "secrets": ([NAME_COL, col("Type", desc="Used to facilitate programmatic handling of secret data. More info: "
                               "https://kubernetes.io/docs/concepts/configuration/secret/#secret-types"),
                 col("Data", "integer", "Data contains the secret data. Each key must consist of alphanumeric "
                     "characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string,"
                     " representing the arbitrary (possibly non-string) data value here. Described in "
                     "https://tools.ietf.org/html/rfc4648#section-4"), AGE_COL],
                lambda o, now: [o["metadata"]["name"], o.get("type") or "Opaque", len(o.get("data") or {}),
                                age(o["metadata"].get("creationTimestamp"), now)]),
    "serviceaccounts": ([NAME_COL, col("Secrets", "string", "Secrets is a list of the secrets in the same namespace "
                                       "that pods running using this ServiceAccount are allowed to use."), AGE_COL],
                        lambda o, now: [o["metadata"]["name"], str(len(o.get("secrets") or [])),
                                        age(o["metadata"].get("creationTimestamp"), now)]),
    "leases.coordination.k8s.io": (
        [NAME_COL, col("Holder", desc="The holder of the lease"), AGE_COL],
        lambda o, now: [o["metadata"]["name"], (o.get("spec") or {}).get("holderIdentity") or "",
                        age(o["metadata"].get("creationTimestamp"), now)]),
    "validatingadmissionpolicies.admissionregistration.k8s.io": (
        [NAME_COL, col("Validations", "integer", "Validations indicates the number of validation rules defined in "
                       "this configuration"),
         col("ParamKind", desc="ParamKind specifies the kind of resources used to parameterize this policy"), AGE_COL],
        lambda o, now: [o["metadata"]["name"], len((o.get("spec") or {}).get("validations") or []),
                        _param_kind((o.get("spec") or {}).get("paramKind")),
                        age(o["metadata"].get("creationTimestamp"), now)]),
    "validatingadmissionpolicybindings.admissionregistration.k8s.io": (
        [NAME_COL, col("PolicyName", desc="PolicyName indicates the policy definition which the policy binding binded "
                       "to"),
         col("ParamRef", desc="ParamRef indicates the param resource which sets the configration param"), AGE_COL],
        lambda o, now: [o["metadata"]["name"], (o.get("spec") or {}).get("policyName", ""),
                        _param_ref((o.get("spec") or {}).get("paramRef")),
                        age(o["metadata"].get("creationTimestamp"), now)]),
    "mutatingwebhookconfigurations.admissionregistration.k8s.io": (
        [NAME_COL, col("Webhooks", "integer", "Webhooks indicates the number of webhooks included in this "
                       "configuration"), AGE_COL],
        lambda o, now: [o["metadata"]["name"], len(o.get("webhooks") or []),
                        age(o["metadata"].get("creationTimestamp"), now)]),
    "validatingwebhookconfigurations.admissionregistration.k8s.io": (
        [NAME_COL, col("Webhooks", "integer", "Webhooks indicates the number of webhooks included in this "
                       "configuration"), AGE_COL],
        lambda o, now: [o["metadata"]["name"], len(o.get("webhooks") or []),
                        age(o["metadata"].get("creationTimestamp"), now)]),
}


def _param_kind(pk: Any) -> str:
    return f"{pk.get('apiVersion', '')}/{pk.get('kind', '')}" if isinstance(pk, dict) else "<unset>"


def _param_ref(ref: Any) -> str:
    if not isinstance(ref, dict):
        return "<unset>"
    name = ref.get("name") or "*"
    return f"{ref['namespace']}/{name}" if ref.get("namespace") else f"*/{name}"

DEFAULT_COLS = [NAME_COL, col("Created At", "date", "CreationTimestamp is a timestamp representing the server time "
                              "when this object was created. It is not guaranteed to be set in happens-before order "
                              "across separate operations. Clients may not set this value. It is represented in "
                              "RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. "
                              "More info: https://git.k8s.io/community/contributors/devel/sig-architecture/"
                              "api-conventions.md#metadata")]


def _crd_columns(rt: ResourceType, version: str) -> list[dict[str, Any]]:
    cols = (rt.printer_columns or {}).get(version)
    if cols is None:
        cols = (rt.printer_columns or {}).get(rt.storage_version) or []
    return cols or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]


def table(rt: ResourceType, version: str, objs: list[dict[str, Any]], meta: dict[str, Any],
          include_object: str = "Metadata", now: float | None = None) -> dict[str, Any]:
    """The Table for ``objs`` (already listed / read) of type ``rt`` served at ``version``."""
    now = time.time() if now is None else now
    cells: Callable[[dict[str, Any], float], Row]
    if not rt.builtin:
        cols = _crd_columns(rt, version)
        defs = [NAME_COL] + [col(c.get("name", ""), c.get("type", "string"), c.get("description", ""),
                                 int(c.get("priority") or 0), c.get("format", "")) for c in cols]

        def crd_cells(o: dict[str, Any], now: float) -> Row:
            return [o["metadata"]["name"]] + [crd_cell(c.get("type", "string"), jsonpath(o, c.get("jsonPath", "")),
                                                       now) for c in cols]
        cells = crd_cells
    elif rt.key in BUILTIN:
        defs, cells = BUILTIN[rt.key]
    else:
        defs = DEFAULT_COLS

        def default_cells(o: dict[str, Any], now: float) -> Row:
            return [o["metadata"]["name"], o["metadata"].get("creationTimestamp")]
        cells = default_cells
    rows = []
    for o in objs:
        row: dict[str, Any] = {"cells": cells(o, now)}
        if include_object == "Object":
            row["object"] = o
        elif include_object == "None":
            row["object"] = None  # an empty RawExtension marshals as null, and omitempty keeps a struct
        else:
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": o["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": defs,
            "rows": rows}


def wants_table(accept: str) -> bool:
    """Whether the first acceptable media type of an Accept header is the meta.k8s.io/v1 Table."""
    if "Table" not in accept:  # as=Table is the only way to ask for one (most requests: a quick no)
        return False
    for part in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip() for p in part.split(";")[1:] if "=" in p}
        if params.get("as") == "Table" and params.get("g", "meta.k8s.io") == "meta.k8s.io" \
                and params.get("v", "v1") == "v1":
            return True
        if part.split(";")[0].strip() in ("application/json", "*/*", "application/yaml"):
            return False
    return False
