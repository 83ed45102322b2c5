"""``python -m kubesim``: serve simulated clusters until SIGINT/SIGTERM, printing each kubeconfig path.

Clusters come from ``--clusters a,b,c`` (each with ``--nodes`` identical nodes sized by ``--node-cpu``,
``--node-memory``, ``--node-gpus``) or from a YAML ``--topology`` file::  clusters: - name: worker-1 seed: 1
kubelet: {start_seconds: 0.05, run_seconds: 1.0, exit_code: 0} nodes: - {name: gpu-1, cpu: "32", memory:
128Gi, extended: {nvidia.com/gpu: "8"}, labels: {pool: a100}} ``mkctl sim up`` calls ``main(argv)`` (or
``run(specs, state_dir)``) directly.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from kubesim import builtin_fields
from kubesim.harness import serve
from kubesim.resources import Catalogue
from kubesim.spec import ClusterSpec, KubeletSpec, NodeSpec


def specs_from_topology(data: dict[str, Any]) -> list[ClusterSpec]:
    out = []
    for c in data.get("clusters") or []:
        nodes = [NodeSpec(name=n["name"], cpu=str(n.get("cpu", "8")), memory=str(n.get("memory", "32Gi")),
                          pods=int(n.get("pods", 110)), extended={k: str(v) for k, v in (n.get("extended") or {}).items()},
                          labels={k: str(v) for k, v in (n.get("labels") or {}).items()})
                 for n in c.get("nodes") or []]
        kl = c.get("kubelet") or {}
        out.append(ClusterSpec(name=c["name"], nodes=nodes, seed=int(c.get("seed", 0)),
                               kubelet=KubeletSpec(**{k: kl[k] for k in ("start_seconds", "run_seconds", "exit_code")
                                                      if k in kl}),
                               authorize=bool(c.get("authorize", False)), tls=bool(c.get("tls", False)),
                               without=tuple(str(w) for w in c.get("without") or ())))
    return out


def specs_from_args(args: argparse.Namespace) -> list[ClusterSpec]:
    if args.topology:
        return specs_from_topology(yaml.safe_load(Path(args.topology).read_text()) or {})
    specs = []
    without: dict[str, list[str]] = {}
    for item in args.without:
        cluster, _, standin = item.partition("=")
        without.setdefault(cluster, []).append(standin)
    for i, name in enumerate(n.strip() for n in args.clusters.split(",") if n.strip()):
        extended = {"nvidia.com/gpu": str(args.node_gpus)} if args.node_gpus else {}
        nodes = [NodeSpec(f"{name}-node-{j}", cpu=args.node_cpu, memory=args.node_memory, pods=args.node_pods,
                          extended=extended) for j in range(args.nodes)]
        specs.append(ClusterSpec(name, nodes, seed=args.seed + i, authorize=args.authorize, tls=args.tls,
                                 without=tuple(without.get(name, ()))))
    return specs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubesim", description="Serve simulated Kubernetes clusters on loopback.")
    p.add_argument("--clusters", default="manager,worker-1,worker-2,worker-3", help="comma-separated names")
    p.add_argument("--topology", help="YAML file describing clusters and nodes (overrides --clusters)")
    p.add_argument("--nodes", type=int, default=2, help="nodes per cluster")
    p.add_argument("--node-cpu", default="8")
    p.add_argument("--node-memory", default="32Gi")
    p.add_argument("--node-pods", type=int, default=110)
    p.add_argument("--node-gpus", type=int, default=0, help="nvidia.com/gpu per node")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--without", action="append", default=[], metavar="CLUSTER=STAND-IN",
                   help="a stand-in operator the cluster does not run (manager=leaderworkerset: a manager cluster, "
                        "where LWS's controller, which has no managedBy to tell it off, must not run); repeatable")
    p.add_argument("--authorize", action="store_true",
                   help="authenticate and authorize every request with RBAC, as kube-apiserver does")
    p.add_argument("--tls", action="store_true",
                   help="serve HTTPS (kubectl sends a kubeconfig's token over TLS only: use it with --authorize)")
    p.add_argument("--state-dir", default="state/kubesim", help="where kubeconfigs are written")
    p.add_argument("--port", type=int, default=0, help="first port (cluster i gets port+i); 0 = free ports")
    return p


def run(specs: list[ClusterSpec], state_dir: Path, ports: dict[str, int] | None = None,
        stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set or SIGINT/SIGTERM arrives (signals only when on the main thread)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    # The built-in kinds' field trees (the official client's models) are resolved before "ready", as a real
    # server has its types compiled in; otherwise the first pod create pays about a second of imports.
    builtin_fields.warm(list(Catalogue().by_key.values()))
    # What is loaded by now lives as long as the process: keep it out of the collector's full passes (as
    # mkd's services do: federation/gctune.py, not imported here: kubesim is a distribution of its own).
    gc.collect()
    gc.freeze()
    with serve(specs, state_dir, ports=ports) as sim:
        for name in sim.names:
            print(f"kubesim: cluster {name} at {sim.url(name)} kubeconfig {sim.kubeconfig(name)}", flush=True)
        print("kubesim: ready", flush=True)
        while not stop.wait(0.5):
            pass


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    specs = specs_from_args(args)
    if not specs:
        print("kubesim: no clusters given", file=sys.stderr)
        return 2
    ports = {s.name: args.port + i for i, s in enumerate(specs)} if args.port else None
    run(specs, Path(args.state_dir), ports)
    return 0
