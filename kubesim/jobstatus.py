"""batch/v1 Job status rules of the v1.36 API server (``jobs/status`` writes), with upstream's messages.

The rules of pkg/apis/batch/validation ``validateJobStatus`` / ``ValidateJobStatusUpdate`` with the options
pkg/registry/batch/job/strategy.go turns on (JobManagedBy is on): most checks fire only when the status
fields they are about change, so an unrelated status write to an odd-looking Job still goes through.
A ``managedBy`` controller (mkd's status mirror, Kueue's MultiKueue) must therefore write a finished Job
the way the Job controller does: ``SuccessCriteriaMet`` before ``Complete`` (both with ``completionTime``
and ``startTime``), ``FailureTarget`` before ``Failed``, no active pods once finished.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kubesim.errors import invalid
from kubesim.kinds import cause, required
from kubesim.resources import ResourceType

Cause = dict[str, str]


def _true(status: dict[str, Any], ctype: str) -> bool:
    return any(isinstance(c, dict) and c.get("type") == ctype and c.get("status") == "True"
               for c in status.get("conditions") or ())


def _omit(field: str, detail: str) -> Cause:
    """field.Invalid with field.OmitValueType{}: the message carries no value."""
    return cause(field, f"Invalid value: {detail}")


def _go_time(ts: Any) -> str:
    """How a *metav1.Time prints in a field error (time.Time.String())."""
    try:
        t = datetime.strptime(str(ts), "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return f'"{ts}"'
    return t.strftime("%Y-%m-%d %H:%M:%S +0000 UTC")


def _bad(field: str, value: int | str, detail: str) -> Cause:
    """field.Invalid; ``value`` is an int or an already quoted string."""
    return cause(field, f"Invalid value: {value}: {detail}")


def check_status_write(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any]) -> None:
    """The store's hook for status writes: 422 Invalid for a Job status the real server refuses."""
    if rt.key != "jobs.batch":
        return
    causes = validate_update(obj, old)
    if causes:
        raise invalid(rt.kind, rt.group, obj["metadata"].get("name", ""), causes)


def validate_update(job: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """The causes a real server gives for writing ``job`` over ``old`` through ``jobs/status``."""
    st: dict[str, Any] = job.get("status") or {}
    ost: dict[str, Any] = old.get("status") or {}
    spec: dict[str, Any] = job.get("spec") or {}
    out: list[Cause] = []

    def complete(s: dict[str, Any]) -> bool:
        return _true(s, "Complete")

    def failed(s: dict[str, Any]) -> bool:
        return _true(s, "Failed")

    def finished(s: dict[str, Any]) -> bool:
        return complete(s) or failed(s)

    def changed(k: str) -> bool:
        return st.get(k) != ost.get(k)

    indexed = spec.get("completionMode") == "Indexed"
    finished_changed = finished(st) != finished(ost)
    complete_changed = complete(st) != complete(ost)
    failed_changed = failed(st) != failed(ost)
    target_changed = _true(st, "FailureTarget") != _true(ost, "FailureTarget")
    met_changed = _true(st, "SuccessCriteriaMet") != _true(ost, "SuccessCriteriaMet")
    active = int(st.get("active") or 0)

    for k in ("active", "succeeded", "failed", "ready", "terminating"):
        v = st.get(k)
        if isinstance(v, int) and v < 0:
            out.append(_bad(f"status.{k}", v, "must be greater than or equal to 0"))
    if (complete_changed or failed_changed) and complete(st) and failed(st):
        out.append(_omit("status.conditions", "cannot set Complete=True and Failed=true conditions"))
    if (complete_changed or target_changed) and complete(st) and _true(st, "FailureTarget"):
        out.append(_omit("status.conditions", "cannot set Complete=True and FailureTarget=true conditions"))
    if (complete_changed or changed("completionTime")):
        if st.get("completionTime") and not complete(st):
            out.append(cause("status.completionTime", f"Invalid value: {_go_time(st['completionTime'])}: cannot "
                             "set completionTime when there is no Complete=True condition"))
        if not st.get("completionTime") and complete(st):
            out.append(required_detail("status.completionTime", "completionTime is required for Complete jobs"))
    if (changed("startTime") or changed("completionTime")) and st.get("startTime") and st.get("completionTime") \
            and str(st["completionTime"]) < str(st["startTime"]):
        out.append(cause("status.completionTime", f"Invalid value: {_go_time(st['completionTime'])}: "
                         "completionTime cannot be set before startTime"))
    if (failed_changed or changed("failedIndexes")) and failed(st) and not _true(st, "FailureTarget"):
        out.append(_omit("status.conditions", "cannot set Failed=True condition without the FailureTarget=true "
                         "condition"))
    if (complete_changed or met_changed) and complete(st) and not _true(st, "SuccessCriteriaMet"):
        out.append(_omit("status.conditions", "cannot set Complete=True condition without the "
                         "SuccessCriteriaMet=true condition"))
    if (finished_changed or changed("active")) and active > 0 and finished(st):
        out.append(_bad("status.active", active, "active>0 is invalid for finished job"))
    suspended_zero = spec.get("suspend") is True and spec.get("completions") == 0
    if (finished_changed or changed("startTime")) and not suspended_zero and finished(st) and not st.get("startTime"):
        out.append(required_detail("status.startTime", "startTime is required for finished job"))
    uncounted = st.get("uncountedTerminatedPods") or {}
    if (finished_changed or changed("uncountedTerminatedPods")) and finished(st) \
            and (uncounted.get("failed") or uncounted.get("succeeded")):
        out.append(cause("status.uncountedTerminatedPods", "Invalid value: "
                         "uncountedTerminatedPods needs to be empty for finished job"))
    if changed("completedIndexes") and st.get("completedIndexes") and not indexed:
        out.append(_bad("status.completedIndexes", f'"{st["completedIndexes"]}"',
                        "cannot set non-empty completedIndexes when non-indexed completion mode"))
    if changed("failedIndexes") and spec.get("backoffLimitPerIndex") is None and st.get("failedIndexes") is not None:
        out.append(_bad("status.failedIndexes", f'"{st["failedIndexes"]}"',
                        "cannot set non-null failedIndexes when backoffLimitPerIndex is null"))
    terminating = st.get("terminating")
    if (finished_changed or changed("terminating")) and isinstance(terminating, int) and terminating > 0 \
            and finished(st):
        out.append(_bad("status.terminating", terminating, "terminating>0 is invalid for finished job"))
    ready = st.get("ready")
    if (changed("ready") or changed("active")) and isinstance(ready, int) and ready > active:
        out.append(_bad("status.ready", ready, "cannot set more ready pods than active"))
    if _true(st, "SuccessCriteriaMet") and failed(st):
        out.append(_omit("status.conditions", "cannot set SuccessCriteriaMet=True and Failed=true conditions"))
    if _true(st, "SuccessCriteriaMet") and _true(st, "FailureTarget"):
        out.append(_omit("status.conditions", "cannot set SuccessCriteriaMet=True and FailureTarget=true "
                         "conditions"))
    if spec.get("successPolicy") is not None and not _true(st, "SuccessCriteriaMet") and complete(st):
        out.append(_omit("status.conditions", "cannot set Complete=True for Job with SuccessPolicy unless "
                         "SuccessCriteriaMet=True"))

    # ValidateJobStatusUpdate: transitions.
    for ctype in ("Failed", "Complete", "FailureTarget"):
        if _true(ost, ctype) and not _true(st, ctype):
            out.append(_omit("status.conditions", f"cannot disable the terminal {ctype}=True condition"))
    if int(st.get("failed") or 0) < int(ost.get("failed") or 0):
        out.append(_bad("status.failed", int(st.get("failed") or 0), "cannot decrease the failed counter"))
    decreasing_ok = indexed and spec.get("completions") == spec.get("parallelism")
    if not decreasing_ok and int(st.get("succeeded") or 0) < int(ost.get("succeeded") or 0):
        out.append(_bad("status.succeeded", int(st.get("succeeded") or 0), "cannot decrease the succeeded counter"))
    if st.get("completionTime") and ost.get("completionTime") and st["completionTime"] != ost["completionTime"]:
        out.append(cause("status.completionTime", f"Invalid value: {_go_time(st['completionTime'])}: "
                         "completionTime cannot be mutated"))
    # Upstream compares the pointers (any change); kubesim refuses only the removal its message names, so
    # that the Job controller's own startTime reset on resume (job_controller.go) is not refused.
    if ost.get("startTime") and not st.get("startTime") and not spec.get("suspend"):
        out.append(required_detail("status.startTime", "startTime cannot be removed for unsuspended job"))
    if _true(ost, "SuccessCriteriaMet") and not _true(st, "SuccessCriteriaMet"):
        out.append(_omit("status.conditions", "cannot disable the SuccessCriteriaMet=True condition"))
    if complete(ost) and not _true(ost, "SuccessCriteriaMet") and _true(st, "SuccessCriteriaMet"):
        out.append(_omit("status.conditions", "cannot set SuccessCriteriaMet=True for Job already has "
                         "Complete=true conditions"))
    return out


def required_detail(field: str, detail: str) -> Cause:
    c = required(field)
    c["message"] = f"Required value: {detail}"
    return c
