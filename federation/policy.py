"""A worker's policy: where placed Jobs may land and what their pods may do.

Shared by both sides: the agent (``worker_agent.policy``) enforces it before it creates anything and announces
it in its heartbeat; the dispatcher checks a Job against each cluster's announced policy before placing it
there, so a Job no cluster would run is told why instead of being placed and refused. A Place carries what a
manager user wrote; the agent creates it with its own (broad) rights. The policy keeps that from becoming a
way into the worker cluster (:class:`Policy` lists what it checks).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Level = Literal["privileged", "baseline", "restricted"]
LEVELS: tuple[Level, ...] = ("privileged", "baseline", "restricted")

BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes"})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                "persistentVolumeClaim", "projected", "secret"})
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
PSA_LABEL = "pod-security.kubernetes.io/"


class PolicySettings(BaseModel):
    """What placed Jobs may do on this worker (env ``MKD_AGENT_POLICY__*``; a ConfigMap in deploy/worker)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace_map: dict[str, str] = Field(default_factory=dict)
    """Manager namespace -> worker namespace; ``"*"`` maps every namespace not listed; otherwise an
    unlisted namespace keeps its name."""

    denied_namespaces: list[str] = Field(default_factory=lambda: ["kube-system", "kube-public", "kube-node-lease"])
    """Worker namespaces no placed Job may land in (the agent's own namespace is always denied too)."""

    allowed_namespaces: list[str] = Field(default_factory=list)
    """When not empty, the only worker namespaces placed Jobs may land in."""

    agent_namespace: str = "mkd-system"
    """The namespace the agent runs in: never a target (its Secrets hold the agent's keys). The agent
    sets it from its own ``namespace`` setting."""

    service_accounts: list[str] = Field(default_factory=list)
    """Service accounts pods may run as. Empty: any except ``agent_service_account``."""

    agent_service_account: str = "mkd-agent"
    """The agent's own service account name, refused to pods whatever ``service_accounts`` says."""

    pod_security: Level = "baseline"
    """Pod Security Standards level enforced on every pod template before anything is created, and set
    as the PSA ``enforce`` label on namespaces the agent creates: privileged, baseline or restricted."""


@dataclass(frozen=True)
class Violation:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class Policy:
    """What a worker allows, checked on a Place before anything is created:

    * **Namespaces.** ``namespace_map`` turns a manager namespace into a worker namespace (unlisted:
      the same name). The result must not be one of ``denied_namespaces`` (``kube-system``,
      ``kube-public``, ``kube-node-lease`` by default) nor the agent's own ``agent_namespace``; when
      ``allowed_namespaces`` is not empty it must be one of them. Namespaces the agent creates carry
      the Pod Security Admission labels of ``pod_security`` (``pod-security.kubernetes.io/enforce``),
      so the API server enforces the same level on every pod in them.
    * **Service accounts.** A pod may name only a service account in ``service_accounts`` (empty: any
      except the agent's own ``agent_service_account``).
    * **Pod Security Standards** (``pod_security``: ``privileged``, ``baseline`` (default) or
      ``restricted``), following the upstream definitions (k8s.io/pod-security-admission, policy
      version latest). ``baseline`` refuses host namespaces (hostNetwork, hostPID, hostIPC),
      privileged containers, Windows HostProcess, capabilities beyond the default set, hostPath
      volumes, host ports, AppArmor ``unconfined``, SELinux types and users/roles beyond the container
      ones, a non-default ``procMount``, seccomp ``Unconfined`` and unsafe sysctls. ``restricted`` adds:
      only ephemeral/projected volume types, ``allowPrivilegeEscalation: false``, ``runAsNonRoot:
      true``, no ``runAsUser: 0``, seccomp ``RuntimeDefault`` or ``Localhost``, and capabilities
      dropping ``ALL`` and adding at most ``NET_BIND_SERVICE``.

    Every pod template in the manifest is checked wherever the kind keeps it (a map with a
    ``containers`` list), and every violation names its field path, so the Rejected report (reason
    ``PolicyViolation``) says exactly what to change.
    """

    def __init__(self, settings: PolicySettings) -> None:
        self.s = settings

    def target_namespace(self, manager_namespace: str) -> str:
        """The worker namespace: the map's entry for it, else its ``"*"`` entry, else the same name."""
        return self.s.namespace_map.get(manager_namespace, self.s.namespace_map.get("*", manager_namespace))

    def namespace_labels(self) -> dict[str, str]:
        """PSA labels for a namespace the agent creates."""
        return {PSA_LABEL + "enforce": self.s.pod_security, PSA_LABEL + "enforce-version": "latest"}

    def check(self, manifest: Mapping[str, Any], namespace: str) -> list[Violation]:
        """Every reason the Job may not be created in worker namespace ``namespace``."""
        out = self._namespace(namespace)
        for path, pod in pod_specs(manifest.get("spec"), "spec"):
            meta = _map(_parent_template_meta(manifest, path))
            out += self._pod(pod, path, meta)
        return out

    def _namespace(self, ns: str) -> list[Violation]:
        s = self.s
        if ns == s.agent_namespace:
            return [Violation("metadata.namespace", f"{ns!r} is the agent's own namespace; placed Jobs may not "
                              "land there (map it elsewhere with policy.namespace_map)")]
        if ns in s.denied_namespaces:
            return [Violation("metadata.namespace", f"{ns!r} is denied on this cluster (policy.denied_namespaces)")]
        if s.allowed_namespaces and ns not in s.allowed_namespaces:
            return [Violation("metadata.namespace", f"{ns!r} is not among this cluster's allowed namespaces "
                              f"({', '.join(s.allowed_namespaces)})")]
        return []

    def _pod(self, pod: Mapping[str, Any], path: str, meta: Mapping[str, Any]) -> list[Violation]:
        out: list[Violation] = []
        sa = pod.get("serviceAccountName") or pod.get("serviceAccount")
        if sa:
            field = f"{path}.serviceAccountName" if pod.get("serviceAccountName") else f"{path}.serviceAccount"
            if sa == self.s.agent_service_account or (self.s.service_accounts and sa not in self.s.service_accounts):
                allowed = ", ".join(self.s.service_accounts) or f"any but {self.s.agent_service_account}"
                out.append(Violation(field, f"service account {sa!r} is not allowed here (allowed: {allowed})"))
        level = self.s.pod_security
        if level == "privileged":
            return out
        out += _baseline(pod, path, meta)
        if level == "restricted":
            out += _restricted(pod, path)
        return out


# --- walking the manifest ---------------------------------------------------------------------


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def pod_specs(node: Any, path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(field path, pod spec) for every map holding a ``containers`` list, wherever the kind keeps it."""
    if isinstance(node, Mapping):
        if isinstance(node.get("containers"), list):
            yield path, node
            return
        for key, value in node.items():
            yield from pod_specs(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from pod_specs(value, f"{path}[{i}]")


def _parent_template_meta(manifest: Mapping[str, Any], spec_path: str) -> Any:
    """The ``metadata`` next to a pod spec (``....template.metadata``): AppArmor annotations live there."""
    if not spec_path.endswith(".spec"):
        return {}
    node: Any = manifest
    for part in spec_path[:-len(".spec")].split("."):
        name, _, index = part.partition("[")
        node = _map(node).get(name)
        while index:
            i, _, index = index.partition("]")
            node = _list(node)[int(i)] if i.isdigit() and int(i) < len(_list(node)) else None
            index = index.lstrip("[")
    return _map(node).get("metadata")


def _containers(pod: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for key in CONTAINER_LISTS:
        for i, c in enumerate(_list(pod.get(key))):
            if isinstance(c, Mapping):
                yield f"{path}.{key}[{i}]", c


# --- the standards ----------------------------------------------------------------------------


def _baseline(pod: Mapping[str, Any], path: str, meta: Mapping[str, Any]) -> list[Violation]:
    out: list[Violation] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key) is True:
            out.append(Violation(f"{path}.{key}", "host namespaces are not allowed (Pod Security baseline)"))
    psc = _map(pod.get("securityContext"))
    out += _common_security(psc, f"{path}.securityContext")
    for i, sysctl in enumerate(_list(psc.get("sysctls"))):
        name = _map(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            out.append(Violation(f"{path}.securityContext.sysctls[{i}].name",
                                 f"sysctl {name!r} is not in the safe set (Pod Security baseline)"))
    for i, vol in enumerate(_list(pod.get("volumes"))):
        if isinstance(vol, Mapping) and "hostPath" in vol:
            out.append(Violation(f"{path}.volumes[{i}].hostPath", "hostPath volumes are not allowed "
                                 "(Pod Security baseline)"))
    annotations = _map(meta.get("annotations"))
    for key, value in annotations.items():
        if str(key).startswith("container.apparmor.security.beta.kubernetes.io/") and value not in (
                "runtime/default", "") and not str(value).startswith("localhost/"):
            out.append(Violation(f"metadata.annotations[{key}]", f"AppArmor profile {value!r} is not allowed "
                                 "(Pod Security baseline)"))
    for cpath, c in _containers(pod, path):
        sc = _map(c.get("securityContext"))
        if sc.get("privileged") is True:
            out.append(Violation(f"{cpath}.securityContext.privileged",
                                 "privileged containers are not allowed (Pod Security baseline)"))
        out += _common_security(sc, f"{cpath}.securityContext")
        if sc.get("procMount") not in (None, "Default"):
            out.append(Violation(f"{cpath}.securityContext.procMount", "only the Default proc mount is allowed "
                                 "(Pod Security baseline)"))
        for j, cap in enumerate(_list(_map(sc.get("capabilities")).get("add"))):
            if cap not in BASELINE_CAPABILITIES:
                out.append(Violation(f"{cpath}.securityContext.capabilities.add[{j}]",
                                     f"capability {cap!r} is beyond the default set (Pod Security baseline)"))
        for j, port in enumerate(_list(c.get("ports"))):
            if _map(port).get("hostPort") not in (None, 0):
                out.append(Violation(f"{cpath}.ports[{j}].hostPort", "host ports are not allowed "
                                     "(Pod Security baseline)"))
    return out


def _common_security(sc: Mapping[str, Any], path: str) -> list[Violation]:
    """What pod- and container-level securityContext share under baseline."""
    out: list[Violation] = []
    if _map(sc.get("windowsOptions")).get("hostProcess") is True:
        out.append(Violation(f"{path}.windowsOptions.hostProcess", "Windows HostProcess pods are not allowed "
                             "(Pod Security baseline)"))
    se = _map(sc.get("seLinuxOptions"))
    if se.get("type", "") not in SELINUX_TYPES:
        out.append(Violation(f"{path}.seLinuxOptions.type", f"SELinux type {se.get('type')!r} is not allowed "
                             "(Pod Security baseline)"))
    for key in ("user", "role"):
        if se.get(key):
            out.append(Violation(f"{path}.seLinuxOptions.{key}", "a custom SELinux user or role is not allowed "
                                 "(Pod Security baseline)"))
    if _map(sc.get("seccompProfile")).get("type") == "Unconfined":
        out.append(Violation(f"{path}.seccompProfile.type", "seccomp Unconfined is not allowed "
                             "(Pod Security baseline)"))
    if _map(sc.get("appArmorProfile")).get("type") == "Unconfined":
        out.append(Violation(f"{path}.appArmorProfile.type", "AppArmor Unconfined is not allowed "
                             "(Pod Security baseline)"))
    return out


def _restricted(pod: Mapping[str, Any], path: str) -> list[Violation]:
    out: list[Violation] = []
    for i, vol in enumerate(_list(pod.get("volumes"))):
        kinds = [k for k in _map(vol) if k != "name"]
        for k in kinds:
            if k not in RESTRICTED_VOLUMES and k != "hostPath":  # hostPath is reported under baseline
                out.append(Violation(f"{path}.volumes[{i}].{k}", f"volume type {k!r} is not allowed "
                                     "(Pod Security restricted)"))
    psc = _map(pod.get("securityContext"))
    pod_seccomp = _map(psc.get("seccompProfile")).get("type")
    pod_non_root = psc.get("runAsNonRoot")
    if psc.get("runAsUser") == 0:
        out.append(Violation(f"{path}.securityContext.runAsUser", "running as user 0 is not allowed "
                             "(Pod Security restricted)"))
    for cpath, c in _containers(pod, path):
        sc = _map(c.get("securityContext"))
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(Violation(f"{cpath}.securityContext.allowPrivilegeEscalation", "must be false "
                                 "(Pod Security restricted)"))
        if sc.get("runAsNonRoot", pod_non_root) is not True:
            out.append(Violation(f"{cpath}.securityContext.runAsNonRoot", "must be true, here or on the pod "
                                 "(Pod Security restricted)"))
        if sc.get("runAsUser") == 0:
            out.append(Violation(f"{cpath}.securityContext.runAsUser", "running as user 0 is not allowed "
                                 "(Pod Security restricted)"))
        seccomp = _map(sc.get("seccompProfile")).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(Violation(f"{cpath}.securityContext.seccompProfile.type", "must be RuntimeDefault or "
                                 "Localhost, here or on the pod (Pod Security restricted)"))
        caps = _map(sc.get("capabilities"))
        if "ALL" not in _list(caps.get("drop")):
            out.append(Violation(f"{cpath}.securityContext.capabilities.drop", "must drop ALL "
                                 "(Pod Security restricted)"))
        for j, cap in enumerate(_list(caps.get("add"))):
            if cap != "NET_BIND_SERVICE" and cap in BASELINE_CAPABILITIES:
                out.append(Violation(f"{cpath}.securityContext.capabilities.add[{j}]", "only NET_BIND_SERVICE "
                                     "may be added (Pod Security restricted)"))
    return out


def describe(violations: list[Violation], limit: int = 20) -> str:
    """One line for a Rejected report: every violation with its field (the first ``limit``)."""
    text = "; ".join(str(v) for v in violations[:limit])
    more = len(violations) - limit
    return text + (f"; and {more} more" if more > 0 else "")
