"""Client CPU per Kubernetes API call through ``federation.kube`` (requests on the event loop).

Against a kubesim in another process (``--kubeconfig``, or one started here), times ``-n`` GETs and
``-n`` status merge-patches of one custom object, first one at a time, then ``--concurrency`` at once,
and prints this process's CPU (``time.process_time``; user and system apart) per call in microseconds.

    python -m bench.kube_http_bench -n 2000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from bench.agent_bench import start_kubesim
from federation.kube import CRDS, Kube, Resource

GIZMOS = Resource("gizmo.mkd.dev", "v1", "gizmos", "Gizmo")


def crd() -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gizmos.gizmo.mkd.dev"},
            "spec": {"group": "gizmo.mkd.dev", "scope": "Namespaced",
                     "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema,
                                   "subresources": {"status": {}}}]}}


@contextlib.contextmanager
def kubesim() -> Iterator[Path]:
    """A kubesim of its own (``bench.agent_bench.start_kubesim``), stopped on exit."""
    with tempfile.TemporaryDirectory() as state:
        proc, config = start_kubesim(Path(state))
        try:
            yield config
        finally:
            proc.terminate()
            proc.wait()


async def timed(label: str, n: int, concurrency: int, call: Callable[[int], Awaitable[Any]]) -> None:
    start, wall, usage = time.process_time(), time.perf_counter(), os.times()
    for base in range(0, n, concurrency):
        await asyncio.gather(*(call(base + i) for i in range(min(concurrency, n - base))))
    cpu, wall, after = time.process_time() - start, time.perf_counter() - wall, os.times()
    user, system = (after.user - usage.user) / n * 1e6, (after.system - usage.system) / n * 1e6
    print(f"{label:<28} x{concurrency:<3} {cpu / n * 1e6:7.1f} µs CPU/call (user {user:5.1f}, system {system:5.1f})"
          f"  ({n / wall:6.0f} calls/s)")


async def run(kubeconfig: Path, n: int, concurrency: int) -> None:
    async with Kube(kubeconfig) as kube:
        with contextlib.suppress(Exception):
            await kube.create(CRDS, crd())
        for _ in range(200):
            kube._discovery.clear()
            if await kube.served(GIZMOS):
                break
            await asyncio.sleep(0.05)
        names = [f"g{i}" for i in range(max(1, concurrency))]
        for name in names:
            with contextlib.suppress(Exception):
                await kube.create(GIZMOS, {"apiVersion": "gizmo.mkd.dev/v1", "kind": "Gizmo",
                                           "metadata": {"name": name, "namespace": "default"}, "spec": {"size": 1}})
        for c in (1, concurrency):
            def get(i: int, c: int = c) -> Awaitable[Any]:
                return kube.get(GIZMOS, names[i % c], "default")

            def patch(i: int, c: int = c) -> Awaitable[Any]:
                return kube.patch(GIZMOS, names[i % c], {"status": {"seen": i}}, "default", subresource="status")

            await timed("GET", n, c, get)
            await timed("PATCH status (merge)", n, c, patch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=2000, help="calls of each kind")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kubeconfig", type=Path, help="an existing kubesim's (else one is started)")
    args = parser.parse_args()
    if args.kubeconfig:
        asyncio.run(run(args.kubeconfig, args.n, args.concurrency))
    else:
        with kubesim() as config:
            asyncio.run(run(config, args.n, args.concurrency))


if __name__ == "__main__":
    main()
