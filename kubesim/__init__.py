"""kubesim: a Kubernetes API emulator served over HTTP on loopback, one server per simulated cluster.

Tests, the demo and benchmarks reach it only through the official ``kubernetes`` client and the
kubeconfigs it writes; production code never imports it. Start clusters with ``serve`` / ``serve_async``
or ``python -m kubesim``.
"""

from kubesim.harness import Sim, SimCluster, serve, serve_async
from kubesim.spec import ClusterSpec, KubeletSpec, NodeSpec

__all__ = ["ClusterSpec", "KubeletSpec", "NodeSpec", "Sim", "SimCluster", "cli_main", "serve", "serve_async"]


def cli_main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m kubesim`` (also for ``mkctl sim up``)."""
    from kubesim.cli import main

    return main(argv)
