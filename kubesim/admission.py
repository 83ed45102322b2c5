"""Admission in kubesim: CRD rules (CEL), ValidatingAdmissionPolicy, and the admissionregistration objects.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubesim import cel, celcheck
from kubesim.errors import ApiError, invalid
from kubesim.resources import ResourceType

if TYPE_CHECKING:
    from kubesim.store import Store

GROUP = "admissionregistration.k8s.io"
VAP = f"validatingadmissionpolicies.{GROUP}"
VAPB = f"validatingadmissionpolicybindings.{GROUP}"
MWC = f"mutatingwebhookconfigurations.{GROUP}"
VWC = f"validatingwebhookconfigurations.{GROUP}"
RAW_CRD = "customresourcedefinitions.apiextensions.k8s.io"
# kubesim has no authentication: every request is the cluster admin's.
USER_INFO = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


# ------------------------------------------------------------------ the request as admission sees it


@dataclass
class Attributes:
    """One admission request (upstream admission.Attributes)."""

    rt: ResourceType
    version: str
    operation: str
    obj: dict[str, Any] | None
    old: dict[str, Any] | None
    subresource: str
    namespace: str
    name: str
    dry_run: bool = False
    options: dict[str, Any] | None = None
    _uid: str = field(default="", repr=False)

    @property
    def uid(self) -> str:
        """The request's uid, made when first asked for (most writes never need one)."""
        if not self._uid:
            self._uid = str(uuid.uuid4())
        return self._uid

    @property
    def resource(self) -> str:
        return f"{self.rt.plural}/{self.subresource}" if self.subresource else self.rt.plural

    def request(self) -> dict[str, Any]:
        """The AdmissionRequest fields (``request`` in CEL, ``request`` in an AdmissionReview)."""
        kind = {"group": self.rt.group, "version": self.version, "kind": self.rt.kind}
        res = {"group": self.rt.group, "version": self.version, "resource": self.rt.plural}
        opts = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}.get(self.operation)
        out: dict[str, Any] = {
            "uid": self.uid, "kind": kind, "resource": res, "requestKind": kind, "requestResource": res,
            "name": self.name, "operation": self.operation, "userInfo": USER_INFO, "dryRun": self.dry_run,
        }
        if self.subresource:
            out["subResource"] = out["requestSubResource"] = self.subresource
        if self.namespace:
            out["namespace"] = self.namespace
        if self.options is not None:
            out["options"] = self.options
        elif opts:
            out["options"] = {"kind": opts, "apiVersion": "meta.k8s.io/v1"}
        return out


def selector_matches(sel: Any, labels: dict[str, Any] | None) -> bool:
    """metav1.LabelSelector semantics: nil or empty selects everything."""
    if not isinstance(sel, dict):
        return True
    labels = labels or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or ():
        k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and k in labels and labels[k] in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


def _rule_matches(rule: dict[str, Any], a: Attributes, equivalent: bool) -> bool:
    if not any(op in ("*", a.operation) for op in rule.get("operations") or ()):
        return False
    if not any(g in ("*", a.rt.group) for g in rule.get("apiGroups") or ()):
        return False
    versions = rule.get("apiVersions") or ()
    if "*" not in versions and a.version not in versions:
        # matchPolicy Equivalent: the same resource through another served version matches too.
        if not (equivalent and any(v in a.rt.versions for v in versions)):
            return False
    scope = rule.get("scope") or "*"
    if (scope == "Namespaced" and not a.rt.namespaced) or (scope == "Cluster" and a.rt.namespaced):
        return False
    want = a.resource
    for r in rule.get("resources") or ():
        if r == want or r == "*/*":
            return True
        res, _, sub = r.partition("/")
        if not a.subresource and r == "*":
            return True
        if a.subresource and ((res == "*" and sub == a.subresource) or (res == a.rt.plural and sub == "*")):
            return True
    return False


class Matcher:
    """The resource, namespace and object part of matchConstraints / matchResources / a webhook."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def namespace_labels(self, a: Attributes) -> dict[str, Any] | None:
        if a.rt.key == "namespaces":
            src = a.obj or a.old or {}
            return (src.get("metadata") or {}).get("labels") or {}
        if not a.rt.namespaced or not a.namespace:
            return None
        rec = self.store.get_rec("namespaces", None, a.namespace)
        return dict(rec.labels or {}) if rec is not None else {}

    def matches(self, spec: dict[str, Any], a: Attributes, rules_key: str = "resourceRules",
                all_without_rules: bool = False) -> bool:
        """``all_without_rules``: the policy matcher's Matches, where no resourceRules match every resource
        (a binding's matchResources that only selects namespaces or objects); a webhook without rules and a
        policy's matchConstraints (which must name rules) match nothing then."""
        equivalent = (spec.get("matchPolicy") or "Equivalent") == "Equivalent"
        rules = spec.get(rules_key) or ()
        if (rules or not all_without_rules) and not any(_rule_matches(r, a, equivalent) and _names_match(r, a) for r in rules):
            return False
        if any(_rule_matches(r, a, equivalent) and _names_match(r, a) for r in spec.get("excludeResourceRules") or ()):
            return False
        ns_labels = self.namespace_labels(a)
        if ns_labels is not None and not selector_matches(spec.get("namespaceSelector"), ns_labels):
            return False
        osel = spec.get("objectSelector")
        if osel:
            objs = [o for o in (a.obj, a.old) if o is not None]
            if not any(selector_matches(osel, (o.get("metadata") or {}).get("labels")) for o in objs):
                return False
        return True

    def namespace_object(self, a: Attributes) -> dict[str, Any] | None:
        if not a.rt.namespaced or not a.namespace or a.rt.key == "namespaces":
            return None
        ns = self.store.get("namespaces", None, a.namespace)
        return {k: ns[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in ns} if ns else None


def rules_match(spec: dict[str, Any], a: Attributes, rules_key: str = "rules") -> bool:
    """The rules part of a webhook / matchConstraints alone (a cheap first filter)."""
    equivalent = (spec.get("matchPolicy") or "Equivalent") == "Equivalent"
    return any(_rule_matches(r, a, equivalent) for r in spec.get(rules_key) or ())


def _names_match(rule: dict[str, Any], a: Attributes) -> bool:
    names = rule.get("resourceNames") or ()
    return not names or a.name in names


# ------------------------------------------------------------------ ValidatingAdmissionPolicy


@dataclass
class Validation:
    program: cel.Program
    expression: str
    message: str
    message_expr: cel.Program | None
    reason: str


@dataclass
class Policy:
    name: str
    spec: dict[str, Any]
    failure_policy: str
    conditions: list[tuple[str, cel.Program]]
    variables: list[tuple[str, cel.Program]]
    validations: list[Validation]
    error: str = ""
    uses_namespace: bool = False


def _compile_policy(obj: dict[str, Any]) -> Policy:
    spec = obj.get("spec") or {}
    p = Policy(obj["metadata"]["name"], spec, spec.get("failurePolicy") or "Fail", [], [], [])
    try:
        for c in spec.get("matchConditions") or ():
            p.conditions.append((c.get("name", ""), cel.compile_expr(c.get("expression", ""))))
        for v in spec.get("variables") or ():
            p.variables.append((v.get("name", ""), cel.compile_expr(v.get("expression", ""))))
        for v in spec.get("validations") or ():
            mexpr = v.get("messageExpression")
            p.validations.append(Validation(cel.compile_expr(v.get("expression", "")), v.get("expression", ""),
                                            v.get("message") or "", cel.compile_expr(mexpr) if mexpr else None,
                                            v.get("reason") or "Invalid"))
    except cel.CompileError as e:
        p.error = str(e)
    p.uses_namespace = "namespaceObject" in str(spec)
    if spec.get("paramKind"):
        p.error = "kubesim does not support paramKind (policies with parameters)"
    return p


REASON_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}


class Admission:
    """Per-cluster admission state.

    The store calls ``Admission.validate`` once per create/update, after its defaulting and validation and
    before anything is written (dry runs included); it raises the real server's Status or returns. In the
    real server's order it runs:

    1. the ``x-kubernetes-validations`` of the custom resource's CRD version (422 Invalid, field errors);
    2. every ValidatingAdmissionPolicy whose ``matchConstraints`` match the request, once per matching
       binding: ``matchConditions``, ``variables``, ``validations`` with message / messageExpression /
       reason; a false validation is handled per ``validationActions`` (Deny: the first denial is the
       answer; Warn: a ``Warning`` header; Audit: there is no audit log, so nothing), an evaluation error per
       ``failurePolicy``.

    Objects of the admissionregistration.k8s.io/v1 kinds are defaulted and validated here as their
    registry strategies do (failurePolicy, matchPolicy, selectors, timeoutSeconds, expressions that must
    compile, webhook names, sideEffects, clientConfig). Mutating/validating webhooks are called by
    ``kubesim.webhooks`` from the HTTP layer, which can wait for them.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.matcher = Matcher(store)
        self._crd_validators: dict[tuple[str, int, str], cel.Validator] = {}
        self._policies: dict[str, tuple[int, Policy]] = {}
        self._bindings_cache: tuple[tuple[int, int], dict[str, list[dict[str, Any]]]] = ((0, 0), {})
        # Warnings for the response of the request being served (the store is single-threaded).
        self.warnings: list[str] = []

    def warn(self, msgs: list[str]) -> None:
        """Collect warnings for the response; writes no response takes (the simulators') keep only a few."""
        if msgs:
            self.warnings += msgs
            if len(self.warnings) > 64:
                del self.warnings[:-64]

    def take_warnings(self) -> list[str]:
        out, self.warnings = self.warnings, []
        return out

    # -------------------------------------------------------------- the store's hook

    def validate(self, rt: ResourceType, operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None,
                 subresource: str | None = None, dry_run: bool = False) -> None:
        """CRD rules, then policies; raises ApiError with the real server's Status."""
        if rt.group == GROUP and obj is not None and subresource is None:
            prepare_registration(rt, obj)
        elif rt.key == RAW_CRD and obj is not None and subresource is None:
            causes = []
            schemas = [((v or {}).get("schema") or {}).get("openAPIV3Schema")
                       for v in (obj.get("spec") or {}).get("versions") or ()]
            if schemas and all(sc == schemas[0] for sc in schemas):
                # The v1 -> internal conversion hoists a schema shared by every version to spec.validation.
                bases = [(schemas[0], "spec.validation.openAPIV3Schema")]
            else:
                bases = [(sc, f"spec.versions[{i}].schema.openAPIV3Schema") for i, sc in enumerate(schemas)]
            known: set[str] = set()  # an update does not judge again what the stored CRD already had
            for v in ((old or {}).get("spec") or {}).get("versions") or ():
                known |= cel.rule_texts(((v or {}).get("schema") or {}).get("openAPIV3Schema"))
            for schema, base in bases:
                causes += cel.rule_compile_causes(schema, base)
                causes += celcheck.schema_causes(schema, base, known, cel.compiled_texts(schema))
            if causes:
                raise invalid(rt.kind, rt.group, (obj.get("metadata") or {}).get("name", ""), causes)
        if not rt.builtin and obj is not None:
            self._crd_rules(rt, obj, old)
        if self.store._objs.get(VAPB):
            src = obj if obj is not None else old or {}
            meta = src.get("metadata") or {}
            version = str(src.get("apiVersion") or rt.api_version()).rpartition("/")[2]
            self.policies(Attributes(rt, version, operation, obj, old, subresource or "",
                                     meta.get("namespace", "") if rt.namespaced else "", meta.get("name", ""),
                                     dry_run))

    # -------------------------------------------------------------- CRD rules

    def crd_validator(self, rt: ResourceType, version: str) -> cel.Validator | None:
        rec = self.store.get_rec(RAW_CRD, None, rt.key)
        if rec is None:
            return None
        k = (rt.key, rec.rv, version)
        v = self._crd_validators.get(k)
        if v is None:
            if len(self._crd_validators) > 1000:
                self._crd_validators.clear()
            crd = rec.obj()
            schema = None
            for ver in (crd.get("spec") or {}).get("versions") or ():
                if ver.get("name") == version:
                    schema = (ver.get("schema") or {}).get("openAPIV3Schema")
            v = self._crd_validators[k] = cel.Validator.for_schema(schema)
        return v

    def crd_rule_causes(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
                        ) -> list[dict[str, str]] | None:
        """The CRD rules' causes for ``obj`` (warnings recorded); None when its version has no rules."""
        version = str(obj.get("apiVersion") or rt.api_version()).rpartition("/")[2]
        v = self.crd_validator(rt, version)
        if v is None or v.root is None:
            return None
        causes, warns = v.validate(obj, old)
        self.warn(warns)
        return causes

    def _crd_rules(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        causes = self.crd_rule_causes(rt, obj, old)
        if causes:
            raise invalid(rt.kind, rt.group, (obj.get("metadata") or {}).get("name", ""), causes)

    # -------------------------------------------------------------- policies

    def _policy(self, name: str) -> Policy | None:
        rec = self.store.get_rec(VAP, None, name)
        if rec is None:
            return None
        hit = self._policies.get(name)
        if hit is None or hit[0] != rec.rv:
            hit = self._policies[name] = (rec.rv, _compile_policy(rec.obj()))
        return hit[1]

    def _bindings(self) -> dict[str, list[dict[str, Any]]]:
        """policyName -> bindings, parsed again only when a binding changed (the rv is global and rising)."""
        recs = self.store._objs.get(VAPB, {}).get("", {})
        sig = (len(recs), max((r.rv for r in recs.values()), default=0))
        if self._bindings_cache[0] != sig:
            out: dict[str, list[dict[str, Any]]] = {}
            for name in sorted(recs):
                b = recs[name].obj()
                out.setdefault((b.get("spec") or {}).get("policyName", ""), []).append(b)
            self._bindings_cache = (sig, out)
        return self._bindings_cache[1]

    def policies(self, a: Attributes) -> None:
        bindings = self._bindings()
        denied: tuple[str, str, str, str] | None = None  # policy, binding, message, reason
        for pname in sorted(bindings):
            p = self._policy(pname)
            if p is None or not self.matcher.matches(p.spec.get("matchConstraints") or {}, a):
                continue
            for b in bindings[pname]:
                bspec = b.get("spec") or {}
                mr = bspec.get("matchResources")
                if mr and not self.matcher.matches(mr, a, all_without_rules=True):
                    continue
                for msg, reason in self._evaluate(p, a):
                    bname = b["metadata"]["name"]
                    actions = bspec.get("validationActions") or ()
                    if reason == "" and p.failure_policy == "Ignore":
                        continue  # an evaluation error under failurePolicy Ignore admits
                    if "Deny" in actions and denied is None:
                        denied = (pname, bname, msg, reason or "Invalid")
                    if "Warn" in actions:
                        self.warn([f"Validation failed for ValidatingAdmissionPolicy '{pname}' with binding "
                                   f"'{bname}': {msg}"])
        if denied is not None:
            pname, bname, msg, reason = denied
            text = f"ValidatingAdmissionPolicy '{pname}' with binding '{bname}' denied request: {msg}"
            raise forbidden(a, text, reason)

    def _evaluate(self, p: Policy, a: Attributes) -> list[tuple[str, str]]:
        """(message, reason) per failed validation; reason "" marks an evaluation error."""
        if p.error:
            return [(f"failed to configure policy: {p.error}", "")]
        data: dict[str, Any] = {"object": a.obj, "oldObject": a.old, "request": a.request(), "params": None,
                                "namespaceObject": self.matcher.namespace_object(a) if p.uses_namespace else None,
                                "variables": {}, "authorizer": None}
        act = cel.activation(data)
        errors: list[str] = []
        for name, prog in p.conditions:
            try:
                ok = prog.eval(act)
            except cel.EvalError as e:
                errors.append(f"expression '{prog.source}' resulted in error: {e}")
                continue
            if ok is not True:
                if ok is False:
                    return []
                errors.append(f"matchCondition '{name}' does not evaluate to a boolean")
        if errors:
            return [("; ".join(errors), "")]
        variables: dict[str, Any] = {}
        data["variables"] = variables
        var_errors: dict[str, str] = {}
        for name, prog in p.variables:
            if "variables" in prog.source and variables:
                act = cel.activation(data)  # a variable built on earlier ones sees them
            try:
                variables[name] = prog.eval(act)
            except cel.EvalError as e:  # surfaces only if a validation uses the variable
                var_errors[name] = str(e)
        if variables:
            act = cel.activation(data)
        out: list[tuple[str, str]] = []
        for v in p.validations:
            try:
                ok = v.program.eval(act)
            except cel.EvalError as e:
                text = str(e)
                for name, err in var_errors.items():
                    if f"variables.{name}" in v.expression:
                        text = err
                        break
                out.append((f"expression '{v.expression}' resulted in error: {text}", ""))
                continue
            if ok is True:
                continue
            msg = ""
            if v.message_expr is not None:
                try:
                    m = v.message_expr.eval(act)
                    if isinstance(m, str) and "\n" not in m.strip() and len(m.strip()) <= cel.MAX_MESSAGE:
                        msg = m.strip()
                except cel.EvalError:
                    pass
            if not msg:
                msg = v.message.strip() or f"failed expression: {v.expression.strip()}"
            out.append((msg, v.reason))
        return out


def forbidden(a: Attributes, message: str, reason: str) -> ApiError:
    """admission.NewForbidden with the decision's reason and code, and the message as the only cause."""
    qualified = f"{a.rt.plural}.{a.rt.group}" if a.rt.group else a.rt.plural
    text = f'{qualified} "{a.name}" is forbidden: {message}' if a.name else f"{qualified} is forbidden: {message}"
    details: dict[str, Any] = {"name": a.name} if a.name else {}
    if a.rt.group:
        details["group"] = a.rt.group
    details["kind"] = a.rt.plural
    details["causes"] = [{"message": message}]
    return ApiError(REASON_CODES.get(reason, 422), reason, text, details)


# ------------------------------------------------------------------ admissionregistration objects


def _default_match(m: dict[str, Any], rules_key: str) -> None:
    m.setdefault("matchPolicy", "Equivalent")
    m.setdefault("namespaceSelector", {})
    m.setdefault("objectSelector", {})
    for r in m.get(rules_key) or ():
        if isinstance(r, dict):
            r.setdefault("scope", "*")


def _compile_causes(exprs: list[tuple[str, Any]]) -> list[dict[str, str]]:
    out = []
    for path, text in exprs:
        if text is None:
            continue
        if not isinstance(text, str) or not text.strip():
            out.append({"reason": "FieldValueRequired", "message": "Required value", "field": path})
            continue
        try:
            cel.compile_expr(text)
        except cel.CompileError as e:
            import orjson
            out.append({"reason": "FieldValueInvalid", "field": path,
                        "message": f"Invalid value: {orjson.dumps(text).decode()}: compilation failed: {e}"})
    return out


def _rule_causes(rules: Any, path: str) -> list[dict[str, str]]:
    out = []
    for i, r in enumerate(rules or ()):
        for k in ("operations", "apiGroups", "apiVersions", "resources"):
            if not (r or {}).get(k):
                out.append({"reason": "FieldValueRequired", "message": "Required value", "field": f"{path}[{i}].{k}"})
        for op in (r or {}).get("operations") or ():
            if op != "*" and op not in OPERATIONS:
                out.append({"reason": "FieldValueNotSupported", "field": f"{path}[{i}].operations[0]",
                            "message": f'Unsupported value: "{op}": supported values: "*", "CONNECT", "CREATE", '
                                       '"DELETE", "UPDATE"'})
    return out


def _failure_causes(value: Any, path: str) -> list[dict[str, str]]:
    if value in ("Fail", "Ignore"):
        return []
    return [{"reason": "FieldValueNotSupported", "field": path,
             "message": f'Unsupported value: "{value}": supported values: "Fail", "Ignore"'}]


def prepare_registration(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Defaults and validation of the four admissionregistration.k8s.io/v1 kinds (422 Invalid)."""
    spec = obj.get("spec")
    causes: list[dict[str, str]] = []
    if rt.key == VAP:
        if not isinstance(spec, dict):
            spec = obj["spec"] = {}
        spec.setdefault("failurePolicy", "Fail")
        causes += _failure_causes(spec["failurePolicy"], "spec.failurePolicy")
        mc = spec.get("matchConstraints")
        if not isinstance(mc, dict):
            causes.append({"reason": "FieldValueRequired", "message": "Required value",
                           "field": "spec.matchConstraints"})
        else:
            _default_match(mc, "resourceRules")
            if not mc.get("resourceRules"):
                causes.append({"reason": "FieldValueRequired", "message": "Required value",
                               "field": "spec.matchConstraints.resourceRules"})
            causes += _rule_causes(mc.get("resourceRules"), "spec.matchConstraints.resourceRules")
        if not spec.get("validations") and not spec.get("auditAnnotations"):
            causes.append({"reason": "FieldValueRequired", "field": "spec.validations",
                           "message": "Required value: validations or auditAnnotations must contain at least one item"})
        exprs: list[tuple[str, Any]] = []
        for i, c in enumerate(spec.get("matchConditions") or ()):
            exprs.append((f"spec.matchConditions[{i}].expression", (c or {}).get("expression", "")))
        for i, v in enumerate(spec.get("variables") or ()):
            exprs.append((f"spec.variables[{i}].expression", (v or {}).get("expression", "")))
        for i, v in enumerate(spec.get("validations") or ()):
            exprs.append((f"spec.validations[{i}].expression", (v or {}).get("expression", "")))
            exprs.append((f"spec.validations[{i}].messageExpression", (v or {}).get("messageExpression")))
            reason = (v or {}).get("reason")
            if reason is not None and reason not in REASON_CODES:
                causes.append({"reason": "FieldValueNotSupported", "field": f"spec.validations[{i}].reason",
                               "message": f'Unsupported value: "{reason}": supported values: "Forbidden", '
                                          '"Invalid", "RequestEntityTooLarge", "Unauthorized"'})
        causes += _compile_causes(exprs)
    elif rt.key == VAPB:
        if not isinstance(spec, dict):
            spec = obj["spec"] = {}
        if not spec.get("policyName"):
            causes.append({"reason": "FieldValueRequired", "message": "Required value", "field": "spec.policyName"})
        actions = spec.get("validationActions") or []
        if not actions:
            causes.append({"reason": "FieldValueRequired", "field": "spec.validationActions",
                           "message": "Required value: at least one validation action is required"})
        for i, act in enumerate(actions):
            if act not in ("Deny", "Warn", "Audit"):
                causes.append({"reason": "FieldValueNotSupported", "field": f"spec.validationActions[{i}]",
                               "message": f'Unsupported value: "{act}": supported values: "Audit", "Deny", "Warn"'})
        if "Deny" in actions and "Warn" in actions:
            causes.append({"reason": "FieldValueInvalid", "field": "spec.validationActions",
                           "message": 'Invalid value: "": Deny and Warn actions are not allowed together'})
        if isinstance(spec.get("matchResources"), dict):
            _default_match(spec["matchResources"], "resourceRules")
    elif rt.key in (MWC, VWC):
        causes += _prepare_webhooks(obj, mutating=rt.key == MWC)
    if causes:
        raise invalid(rt.kind, rt.group, (obj.get("metadata") or {}).get("name", ""), causes)


def _prepare_webhooks(obj: dict[str, Any], mutating: bool) -> list[dict[str, str]]:
    causes: list[dict[str, str]] = []
    hooks = obj.get("webhooks") or []
    seen: set[str] = set()
    for i, w in enumerate(hooks):
        p = f"webhooks[{i}]"
        if not isinstance(w, dict):
            causes.append({"reason": "FieldValueInvalid", "message": "Invalid value: must be an object", "field": p})
            continue
        name = w.get("name") or ""
        if not name:
            causes.append({"reason": "FieldValueRequired", "message": "Required value", "field": f"{p}.name"})
        elif len(name.split(".")) < 3:
            causes.append({"reason": "FieldValueInvalid", "field": f"{p}.name",
                           "message": f'Invalid value: "{name}": should be a domain with at least three segments '
                                      "separated by dots"})
        elif name in seen:
            causes.append({"reason": "FieldValueDuplicate", "message": f'Duplicate value: "{name}"',
                           "field": f"{p}.name"})
        seen.add(name)
        w.setdefault("failurePolicy", "Fail")
        causes += _failure_causes(w["failurePolicy"], f"{p}.failurePolicy")
        w.setdefault("matchPolicy", "Equivalent")
        w.setdefault("namespaceSelector", {})
        w.setdefault("objectSelector", {})
        w.setdefault("timeoutSeconds", 10)
        if mutating:
            w.setdefault("reinvocationPolicy", "Never")
        for r in w.get("rules") or ():
            if isinstance(r, dict):
                r.setdefault("scope", "*")
        causes += _rule_causes(w.get("rules"), f"{p}.rules")
        t = w["timeoutSeconds"]
        if not isinstance(t, int) or not 1 <= t <= 30:
            causes.append({"reason": "FieldValueInvalid", "field": f"{p}.timeoutSeconds",
                           "message": f"Invalid value: {t}: the timeout value must be between 1 and 30 seconds"})
        se = w.get("sideEffects")
        if not se:
            causes.append({"reason": "FieldValueRequired", "field": f"{p}.sideEffects",
                           "message": "Required value: must specify one of None, NoneOnDryRun"})
        elif se not in ("None", "NoneOnDryRun"):
            causes.append({"reason": "FieldValueNotSupported", "field": f"{p}.sideEffects",
                           "message": f'Unsupported value: "{se}": supported values: "None", "NoneOnDryRun"'})
        arv = w.get("admissionReviewVersions") or []
        if not arv:
            causes.append({"reason": "FieldValueRequired", "field": f"{p}.admissionReviewVersions",
                           "message": "Required value: must specify one of v1, v1beta1"})
        elif "v1" not in arv:
            causes.append({"reason": "FieldValueInvalid", "field": f"{p}.admissionReviewVersions",
                           "message": "Invalid value: " + str(arv).replace("'", '"') + ": kubesim speaks "
                                      "AdmissionReview v1 only; include v1"})
        cc = w.get("clientConfig") or {}
        url, svc = cc.get("url"), cc.get("service")
        if bool(url) == bool(svc):
            causes.append({"reason": "FieldValueRequired", "field": f"{p}.clientConfig",
                           "message": "Required value: exactly one of url or service is required"})
        elif url and not str(url).startswith("https://"):
            causes.append({"reason": "FieldValueInvalid", "field": f"{p}.clientConfig.url",
                           "message": f'Invalid value: "{url}": \'https\' is the only allowed URL scheme'})
        elif svc:
            svc.setdefault("port", 443)
            for k in ("namespace", "name"):
                if not svc.get(k):
                    causes.append({"reason": "FieldValueRequired", "message": "Required value",
                                   "field": f"{p}.clientConfig.service.{k}"})
        exprs = [(f"{p}.matchConditions[{j}].expression", (c or {}).get("expression", ""))
                 for j, c in enumerate(w.get("matchConditions") or ())]
        causes += _compile_causes(exprs)
    return causes
