"""Per-kind validation and defaulting, the part of each upstream registry strategy that mkd can observe.

``validate_name`` applies the name rule of a resource type (DNS-1123 subdomain / label, DNS-1035 label,
path segment). ``prepare_create`` / ``prepare_update`` fill the defaults the real API server writes (pods,
services, jobs, namespaces, CRDs) and raise 422 Invalid for missing required fields.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

from kubesim import quantity
from kubesim.errors import ApiError, invalid, too_long
from kubesim.records import now
from kubesim.resources import ResourceType

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

MSG_SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                 "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
                 "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
MSG_LABEL = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
MSG_1035 = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
            "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
            "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")


# apimachinery pkg/api/validate/content/kube.go: IsLabelKey / IsLabelValue (MaxLenError, then RegexError).
MSG_LABEL_KEY = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                 "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation "
                 "is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
MSG_LABEL_VALUE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                   "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def label_value_errors(v: str) -> list[str]:
    out = []
    if len(v.encode()) > 63:
        out.append("must be no more than 63 bytes")
    if not LABEL_VALUE.fullmatch(v):
        out.append(MSG_LABEL_VALUE)
    return out


def label_key_errors(k: str) -> list[str]:
    out = []
    parts = k.split("/")
    if len(parts) > 2:
        return ["a valid label key " + MSG_LABEL_KEY +
                " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            out.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                out.append("prefix part must be no more than 253 bytes")
            if not DNS1123_SUBDOMAIN.fullmatch(prefix):
                out.append("prefix part " + MSG_SUBDOMAIN)
    if not name:
        out.append("name part must be non-empty")
    elif len(name.encode()) > 63:
        out.append("name part must be no more than 63 bytes")
    if not LABEL_NAME.fullmatch(name):
        out.append("name part " + MSG_LABEL_KEY)
    return out


def cause(field: str, message: str, reason: str = "FieldValueInvalid") -> dict[str, str]:
    return {"reason": reason, "message": message, "field": field}


def bad_value(field: str, value: Any, detail: str) -> dict[str, str]:
    import orjson
    return cause(field, f"Invalid value: {orjson.dumps(value).decode()}: {detail}")


def required(field: str, detail: str = "") -> dict[str, str]:
    return cause(field, f"Required value: {detail}" if detail else "Required value", "FieldValueRequired")


def name_causes(rule: str, name: str, field: str = "metadata.name") -> list[dict[str, str]]:
    if rule == "path":
        if name in (".", "..") or "/" in name or "%" in name:
            return [bad_value(field, name, "may not contain '/' or '%' or be '.' or '..'")]
        return []
    if rule == "label" or rule == "dns1035":
        out = []
        if len(name) > 63:
            out.append(bad_value(field, name, "must be no more than 63 characters"))
        if rule == "label" and not DNS1123_LABEL.match(name):
            out.append(bad_value(field, name, MSG_LABEL))
        if rule == "dns1035" and not DNS1035_LABEL.match(name):
            out.append(bad_value(field, name, MSG_1035))
        return out
    out = []
    if len(name) > 253:
        out.append(bad_value(field, name, "must be no more than 253 characters"))
    if not DNS1123_SUBDOMAIN.match(name):
        out.append(bad_value(field, name, MSG_SUBDOMAIN))
    return out


TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024


def validate_labels(meta: dict[str, Any]) -> list[dict[str, str]]:
    """ObjectMeta label rules and the 256 KiB limit on all annotations together (keys + values)."""
    out = []
    annotations = meta.get("annotations")
    # Characters bound the UTF-8 size from below and 4x characters from above: count bytes only when needed.
    if isinstance(annotations, dict) and annotations and \
            4 * sum(len(str(k)) + len(str(v)) for k, v in annotations.items()) > TOTAL_ANNOTATION_SIZE_LIMIT:
        total = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
        if total > TOTAL_ANNOTATION_SIZE_LIMIT:
            out.append(too_long("metadata.annotations", TOTAL_ANNOTATION_SIZE_LIMIT))
    good_values, good_keys = _GOOD_LABEL_VALUES, _GOOD_LABEL_KEYS
    for k, v in (meta.get("labels") or {}).items():
        if k not in good_keys:
            msgs = label_key_errors(k) if isinstance(k, str) else [MSG_LABEL_KEY]
            out.extend(bad_value("metadata.labels", k, m) for m in msgs)
            if not msgs:
                _remember(good_keys, k)
        if type(v) is not str or v not in good_values:
            msgs = label_value_errors(v) if isinstance(v, str) else [MSG_LABEL_VALUE]
            out.extend(bad_value("metadata.labels", v, m) for m in msgs)
            if not msgs:
                _remember(good_values, v)
    return out


_GOOD_LABEL_KEYS: set[str] = set()
_GOOD_LABEL_VALUES: set[str] = set()
"""Label keys and values found valid (the checks are pure; a few regular expressions per label per write
were ~10 us for a pod with a dozen labels, and the same keys and most values repeat on every write)."""


def _remember(seen: set[str], text: str) -> None:
    if len(seen) >= 8192:
        seen.clear()
    seen.add(text)


# ---------------------------------------------------------------- pods

def _default_container(c: dict[str, Any]) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    image = c.get("image") or ""
    tag = image.rsplit("/", 1)[-1]
    if "imagePullPolicy" not in c:
        c["imagePullPolicy"] = "Always" if ("@" not in tag and (":" not in tag or tag.endswith(":latest"))) \
            else "IfNotPresent"
    res = c.setdefault("resources", {})
    for part in ("requests", "limits"):
        _canonical_quantities(res.get(part))
    # Requests default to limits when only limits are given (core/v1 defaults).
    if res.get("limits"):
        req = res.setdefault("requests", {})
        for k, v in res["limits"].items():
            req.setdefault(k, v)
    for p in c.get("ports") or []:
        p.setdefault("protocol", "TCP")
    for e in c.get("env") or []:
        vf = e.get("valueFrom") or {}
        if "fieldRef" in vf:
            vf["fieldRef"].setdefault("apiVersion", "v1")


def _canonical_quantities(resources: Any) -> None:
    """Quantities are stored and returned in canonical string form (``1`` -> ``"1"``, ``0.5`` -> ``"500m"``);
    raises QuantityError for a value that is not a quantity (a decode error upstream)."""
    if isinstance(resources, dict):
        for k, v in resources.items():
            resources[k] = quantity.canonical(v)


def default_pod_spec(spec: dict[str, Any], restart_default: str | None = "Always") -> None:
    if restart_default is not None:
        spec.setdefault("restartPolicy", restart_default)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for c in spec.get("initContainers") or []:
        _default_container(c)
    for c in spec.get("containers") or []:
        _default_container(c)
    _canonical_quantities(spec.get("overhead"))
    for part in ("requests", "limits"):
        _canonical_quantities((spec.get("resources") or {}).get(part))
    for v in spec.get("volumes") or []:
        if isinstance((v.get("emptyDir") or {}).get("sizeLimit"), (int, float, str)):
            v["emptyDir"]["sizeLimit"] = quantity.canonical(v["emptyDir"]["sizeLimit"])
        if "configMap" in v:
            v["configMap"].setdefault("defaultMode", 420)
        if "secret" in v:
            v["secret"].setdefault("defaultMode", 420)
        if "emptyDir" in v and v["emptyDir"] is None:
            v["emptyDir"] = {}


def validate_pod_spec(spec: Any, prefix: str, restart_allowed: tuple[str, ...] | None = None
                      ) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    if not isinstance(spec, dict):
        return [required(prefix)]
    containers = spec.get("containers")
    if not containers:
        out.append(required(f"{prefix}.containers"))
    names: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            f = f"{prefix}.{kind}[{i}]"
            nm = c.get("name")
            if not nm:
                out.append(required(f"{f}.name"))
            else:
                out += name_causes("label", nm, f"{f}.name")
                if nm in names:
                    out.append(cause(f"{f}.name", f'Duplicate value: "{nm}"', "FieldValueDuplicate"))
                names.add(nm)
            if not c.get("image"):
                out.append(required(f"{f}.image"))
    rp = spec.get("restartPolicy")
    if restart_allowed is not None and rp not in restart_allowed:
        if rp is None:
            out.append(required(f"{prefix}.restartPolicy"))
        else:
            out.append(cause(f"{prefix}.restartPolicy", f'Unsupported value: "{rp}": supported values: '
                             + ", ".join(f'"{x}"' for x in restart_allowed), "FieldValueNotSupported"))
    for fld in ("hostname", "subdomain"):
        v = spec.get(fld)
        if v:
            out += name_causes("label", v, f"{prefix}.{fld}")
    return out


def qos_class(spec: dict[str, Any]) -> str:
    reqs: list[dict[str, Any]] = []
    lims: list[dict[str, Any]] = []
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        r = c.get("resources") or {}
        reqs.append({k: v for k, v in (r.get("requests") or {}).items() if k in ("cpu", "memory")})
        lims.append({k: v for k, v in (r.get("limits") or {}).items() if k in ("cpu", "memory")})
    if not any(reqs) and not any(lims):
        return "BestEffort"
    guaranteed = all(
        set(li) == {"cpu", "memory"} and all(str(rq.get(k)) == str(li[k]) for k in li)
        for rq, li in zip(reqs, lims, strict=True)
    )
    return "Guaranteed" if guaranteed else "Burstable"


DEFAULT_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
]


def prepare_pod(obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, str]]:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        default_pod_spec(spec)
    causes = validate_pod_spec(spec, "spec", ("Always", "OnFailure", "Never"))
    if causes or not isinstance(spec, dict):
        return causes
    if old is None:
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        spec.setdefault("priority", 0)
        tols = spec.setdefault("tolerations", [])
        for t in DEFAULT_TOLERATIONS:
            if not any(x.get("key") == t["key"] for x in tols):
                tols.append(dict(t))
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}
    else:
        # Upstream allows only a few pod spec fields to change (images, deadlines, added tolerations,
        # removed scheduling gates; a gated pod may also gain nodeSelector entries).
        ospec = dict(old.get("spec") or {})
        nspec = dict(spec)
        causes = _gate_update_causes(ospec, nspec)
        if causes:
            return causes
        movable = ["activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates"]
        if ospec.get("schedulingGates"):
            movable.append("nodeSelector")
        for s in (ospec, nspec):
            for k in movable:
                s.pop(k, None)
            for kind in ("containers", "initContainers"):
                s[kind] = [{k: v for k, v in c.items() if k != "image"} for c in s.get(kind) or []]
        if ospec != nspec:
            return [cause("spec", "Forbidden: pod updates may not change fields other than `spec.containers[*]"
                          ".image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
                          "`spec.tolerations` (only additions to existing tolerations),"
                          "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously "
                          "negative)", "FieldValueForbidden")]
    return []


def _gate_update_causes(ospec: dict[str, Any], nspec: dict[str, Any]) -> list[dict[str, str]]:
    """Scheduling gates may only be removed; while gated, nodeSelector may only gain entries (upstream rule)."""
    causes: list[dict[str, str]] = []
    had = {g.get("name") for g in ospec.get("schedulingGates") or [] if isinstance(g, dict)}
    for i, g in enumerate(nspec.get("schedulingGates") or []):
        name = g.get("name") if isinstance(g, dict) else None
        if name not in had:
            causes.append(cause(f"spec.schedulingGates[{i}].name", "Forbidden: only deletion is allowed, but "
                                f"found new scheduling gate '{name}'", "FieldValueForbidden"))
    if had:
        osel = ospec.get("nodeSelector") or {}
        nsel = nspec.get("nodeSelector") or {}
        if any(nsel.get(k) != v for k, v in osel.items()):
            causes.append(bad_value("spec.nodeSelector", nsel, "only additions to spec.nodeSelector are allowed "
                                    "(no mutations or deletions)"))
    return causes


# ---------------------------------------------------------------- services

def prepare_service(obj: dict[str, Any], old: dict[str, Any] | None, alloc_ip: Any) -> list[dict[str, str]]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    causes: list[dict[str, str]] = []
    headless = spec.get("clusterIP") == "None"
    ports = spec.get("ports") or []
    if not ports and not headless and spec["type"] != "ExternalName":
        causes.append(required("spec.ports"))
    for i, p in enumerate(ports):
        p.setdefault("protocol", "TCP")
        if "port" not in p:
            causes.append(required(f"spec.ports[{i}].port"))
        p.setdefault("targetPort", p.get("port"))
        if len(ports) > 1 and not p.get("name"):
            causes.append(required(f"spec.ports[{i}].name"))
    if causes:
        return causes
    if spec["type"] != "ExternalName":
        if old is not None and (old.get("spec") or {}).get("clusterIP"):
            spec["clusterIP"] = old["spec"]["clusterIP"]
        elif not spec.get("clusterIP"):
            spec["clusterIP"] = alloc_ip()
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    if old is None:
        obj["status"] = {"loadBalancer": {}}
    return []


# ---------------------------------------------------------------- jobs

def prepare_job(obj: dict[str, Any], old: dict[str, Any] | None, uid: str) -> list[dict[str, str]]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    tmpl = spec.get("template")
    if not isinstance(tmpl, dict):
        return [required("spec.template")]
    causes = validate_pod_spec(tmpl.get("spec"), "spec.template.spec", ("OnFailure", "Never"))
    if causes:
        return causes
    name = obj["metadata"]["name"]
    if len(name) > 63:
        causes.append(bad_value("metadata.name", name, "must be no more than 63 characters"))
    mode = spec.setdefault("completionMode", "NonIndexed")
    if mode not in ("NonIndexed", "Indexed"):
        causes.append(cause("spec.completionMode", f'Unsupported value: "{mode}": supported values: '
                            '"NonIndexed", "Indexed"', "FieldValueNotSupported"))
    if mode == "Indexed" and spec.get("completions") is None:
        causes.append(required("spec.completions"))
    if causes:
        return causes
    # Upstream defaulting: both unset -> both 1; parallelism alone -> completions stays unset (a work queue).
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    if spec.get("parallelism") is None:
        spec["parallelism"] = 1
    if spec.get("completions") is None:
        spec.pop("completions", None)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    has_pfp = bool(spec.get("podFailurePolicy"))
    spec.setdefault("podReplacementPolicy", "Failed" if has_pfp else "TerminatingOrFailed")
    default_pod_spec(tmpl.setdefault("spec", {}), restart_default=None)
    if old is None:
        if not spec.get("manualSelector"):
            sel = {"batch.kubernetes.io/controller-uid": uid}
            spec["selector"] = {"matchLabels": sel}
            labels = tmpl.setdefault("metadata", {}).setdefault("labels", {})
            labels.update({"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                           "controller-uid": uid, "job-name": name})
        obj["status"] = {}
    else:
        ospec = old.get("spec") or {}
        if spec.get("selector") != ospec.get("selector"):
            return [bad_value("spec.selector", spec.get("selector"), "field is immutable")]
        if spec.get("completionMode") != ospec.get("completionMode"):
            return [bad_value("spec.completionMode", spec.get("completionMode"), "field is immutable")]
        if spec.get("managedBy") != ospec.get("managedBy"):
            return [bad_value("spec.managedBy", spec.get("managedBy"), "field is immutable")]
        if spec.get("completions") != ospec.get("completions"):
            # Only elastic Indexed Jobs may change completions, and only together with parallelism.
            if spec.get("completionMode") != "Indexed":
                return [bad_value("spec.completions", spec.get("completions"), "field is immutable")]
            if spec.get("completions") != spec.get("parallelism"):
                return [bad_value("spec.completions", spec.get("completions"),
                                  "can only be modified in tandem with spec.parallelism")]
        if spec.get("template") != ospec.get("template"):
            # Suspended jobs accept new scheduling directives (what Kueue injects), nothing else.
            never_started = not (old.get("status") or {}).get("startTime")
            mutable_directives = bool(ospec.get("suspend")) and never_started
            new_t, old_t = _sched_free(spec.get("template")), _sched_free(ospec.get("template"))
            if not (mutable_directives and new_t == old_t):
                # v1.36 names the pod spec when a suspended, never started Job's template spec changed
                # beyond its scheduling directives (observed on a real v1.36 server).
                if mutable_directives and isinstance(new_t, dict) and isinstance(old_t, dict) \
                        and {k: v for k, v in new_t.items() if k != "spec"} == \
                        {k: v for k, v in old_t.items() if k != "spec"}:
                    return [bad_value("spec.template.spec", (spec.get("template") or {}).get("spec"),
                                      "field is immutable")]
                return [bad_value("spec.template", spec.get("template"), "field is immutable")]
    return []


def _sched_free(tmpl: Any) -> Any:
    """A pod template without the scheduling directives a suspended Job may change."""
    if not isinstance(tmpl, dict):
        return tmpl
    meta = {k: v for k, v in (tmpl.get("metadata") or {}).items() if k not in ("labels", "annotations")}
    spec = {k: v for k, v in (tmpl.get("spec") or {}).items()
            if k not in ("nodeSelector", "tolerations", "affinity", "schedulingGates")}
    # Of the affinity only nodeAffinity is a scheduling directive; pod (anti-)affinity stays immutable.
    affinity = (tmpl.get("spec") or {}).get("affinity")
    if isinstance(affinity, dict):
        rest = {k: v for k, v in affinity.items() if k != "nodeAffinity" and v is not None}
        if rest:
            spec["affinity"] = rest
    return {**tmpl, "metadata": meta, "spec": spec}


# ---------------------------------------------------------------- others

def prepare_secret(obj: dict[str, Any]) -> list[dict[str, str]]:
    obj.setdefault("type", "Opaque")
    causes: list[dict[str, str]] = []
    for v in (obj.get("data") or {}).values():
        try:
            base64.b64decode(v, validate=True)
        except (ValueError, TypeError):
            # Upstream fails while decoding the []byte field, before validation: a 400, not a 422.
            raise ApiError(400, "BadRequest", "illegal base64 data in Secret data") from None
    sd = obj.pop("stringData", None)
    if isinstance(sd, dict):
        data = obj.setdefault("data", {})
        for k, v in sd.items():
            data[k] = base64.b64encode(str(v).encode()).decode()
    return causes


def prepare_crd(obj: dict[str, Any]) -> list[dict[str, str]]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    names = spec.get("names") or {}
    causes = []
    for f in ("group",):
        if not spec.get(f):
            causes.append(required(f"spec.{f}"))
    for f in ("plural", "kind"):
        if not names.get(f):
            causes.append(required(f"spec.names.{f}"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(cause("spec.scope", f'Unsupported value: "{spec.get("scope")}": supported values: '
                            '"Cluster", "Namespaced"', "FieldValueNotSupported"))
    versions = spec.get("versions") or []
    if not versions:
        causes.append(required("spec.versions"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        causes.append(cause("spec.versions", "Invalid value: must have exactly one version marked as "
                            "storage version"))
    name = obj["metadata"]["name"]
    if names.get("plural") and spec.get("group") and name != f"{names['plural']}.{spec['group']}":
        causes.append(bad_value("metadata.name", name, "must be spec.names.plural+\".\"+spec.group"))
    if causes:
        return causes
    names.setdefault("singular", names["kind"].lower())
    names.setdefault("listKind", names["kind"] + "List")
    spec.setdefault("conversion", {"strategy": "None"})
    return []


MoreRules = Callable[[str, dict[str, Any], "dict[str, Any] | None"], list[dict[str, str]]]
"""The rules of kinds defined elsewhere (kubesim.deploykinds): storage key, object, old object -> causes."""


def apply_kind_rules(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, alloc_ip: Any,
                     more: MoreRules | None = None) -> None:
    """Validate + default ``obj`` in place for its kind (``more`` for kinds this module does not know);
    raises 422 Invalid."""
    try:
        _apply_kind_rules(rt, obj, old, alloc_ip, more)
    except quantity.QuantityError as e:
        raise ApiError(400, "BadRequest", f'{rt.kind} in version "{rt.versions[0]}" cannot be handled as a '
                       f"{rt.kind}: {e}") from None


def _apply_kind_rules(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, alloc_ip: Any,
                      more: MoreRules | None) -> None:
    meta = obj["metadata"]
    key = rt.key
    causes = validate_labels(meta)
    if key == "pods":
        causes += prepare_pod(obj, old)
    elif key == "services":
        causes += prepare_service(obj, old, alloc_ip)
    elif key == "jobs.batch":
        causes += prepare_job(obj, old, meta["uid"])
    elif key == "secrets":
        causes += prepare_secret(obj)
    elif key == "customresourcedefinitions.apiextensions.k8s.io":
        causes += prepare_crd(obj)
    elif key == "namespaces":
        # The namespace lifecycle always sets this label (namespaceSelectors rely on it).
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        if old is None:
            obj["status"] = {"phase": "Active"}
    elif key == "events" and not obj.get("involvedObject"):
        causes.append(required("involvedObject"))
    elif key == "podtemplates" and isinstance((obj.get("template") or {}).get("spec"), dict):
        default_pod_spec(obj["template"]["spec"])
    elif key == "leases.coordination.k8s.io":
        obj.setdefault("spec", {})
    elif more is not None:
        causes += more(key, obj, old)
    if causes:
        raise invalid(rt.kind, rt.group, meta.get("name", ""), causes)


def check_kind_and_version(rt: ResourceType, obj: dict[str, Any]) -> None:
    kind = obj.get("kind")
    if kind and kind != rt.kind and not rt.builtin:
        # The custom resource validator's ValidateTypeMeta, reported under the kind the body claims.
        name = (obj.get("metadata") or {}).get("name", "") if isinstance(obj.get("metadata"), dict) else ""
        raise invalid(str(kind), rt.group, name, [bad_value("kind", kind, f"must be {rt.kind}")])
    if kind and kind != rt.kind:
        raise ApiError(400, "BadRequest", f"the object provided is unrecognized (must be of type {rt.kind}): "
                       f"{kind}")


def node_object(n: Any, index: int = 0) -> dict[str, Any]:
    """The Node a NodeSpec describes: capacity = allocatable, Ready, hostname label."""
    res = {"cpu": n.cpu, "memory": n.memory, "pods": str(n.pods), "ephemeral-storage": "100Gi", **n.extended}
    _canonical_quantities(res)
    t = now()
    labels = {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", **n.labels}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "labels": labels, "annotations": {"kubesim.mkd.dev/simulated": "true"}},
        "spec": {},
        "status": {
            "capacity": dict(res), "allocatable": dict(res),
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status", "lastHeartbeatTime": t, "lastTransitionTime": t},
                *[{"type": c, "status": "False", "reason": f"KubeletHas{r}", "message": m,
                   "lastHeartbeatTime": t, "lastTransitionTime": t}
                  for c, r, m in (("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
                                  ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
                                  ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"))],
            ],
            "addresses": [{"type": "InternalIP", "address": f"172.18.{index // 250}.{index % 250 + 2}"},
                          {"type": "Hostname", "address": n.name}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.31.0-kubesim",
                         "containerRuntimeVersion": "kubesim://1.0", "kernelVersion": "6.0.0", "osImage": "kubesim",
                         "kubeProxyVersion": "v1.31.0-kubesim", "machineID": "", "systemUUID": "", "bootID": ""},
            "phase": "Running",
        },
    }
