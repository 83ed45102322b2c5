"""Cluster topology for kubesim: what one simulated cluster looks like (its nodes and kubelet defaults).

These dataclasses are the whole configuration surface of a simulated cluster; the API server turns each
``NodeSpec`` into a Node object and the simulators in ``kubesim.sim`` read ``KubeletSpec`` and ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KubeletSpec:
    """Defaults for the simulated kubelet; pod annotations ``kubesim.mkd.dev/*`` override them per pod."""

    start_seconds: float = 0.05
    run_seconds: float = 1.0
    exit_code: int = 0


@dataclass(frozen=True)
class NodeSpec:
    """One node: its allocatable resources (quantities as Kubernetes strings) and extra labels."""

    name: str
    cpu: str = "8"
    memory: str = "32Gi"
    pods: int = 110
    extended: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterSpec:
    """One simulated cluster; ``seed`` makes the simulators deterministic."""

    name: str
    nodes: list[NodeSpec] = field(default_factory=list)
    seed: int = 0
    kubelet: KubeletSpec = field(default_factory=KubeletSpec)
    without: tuple[str, ...] = ()
    """Operator stand-ins this cluster does not run (``"leaderworkerset"``: a manager cluster, where LWS's controller,
    which has no managedBy to tell it off, must not run what mkd dispatches)."""
    authorize: bool = False
    """Authenticate and authorize every request as kube-apiserver with RBAC does (kubesim/authz.py);
    off, every request is served (the kubeconfig's admin may do everything either way)."""
    tls: bool = False
    """Serve HTTPS, as every kube-apiserver does: a serving certificate for 127.0.0.1 signed by the
    cluster's root CA (``kube-root-ca.crt``), which the kubeconfig carries. kubectl (client-go) sends a
    kubeconfig's token only over TLS, so an authorizing cluster is usable from kubectl only with it."""
