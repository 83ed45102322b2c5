"""Server CPU-ms per pod create of kubesim at an older commit against this tree, same client, same session.

    .venv/bin/python bench/kubesim_compare.py --before ea0218f [--pods 2000] [--rounds 2]

The older kubesim is extracted with ``git archive`` into a temporary directory; each round measures the
older server, then this one (``python -m kubesim`` in a child process, one client thread, 200 warm-up
creates), then the in-process cost of ``Store.create_rec`` for a pod (no HTTP) of each. On a shared machine
the rates swing with the load; the CPU figures are the ones to compare.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench.kubesim_bench as kb

ROOT = Path(__file__).resolve().parents[1]


def measure(root: Path, n: int) -> tuple[float, float]:
    kb.ROOT = root  # the child server runs with PYTHONPATH=root
    with tempfile.TemporaryDirectory() as d:
        srv = kb.Server(Path(d))
        try:
            client.CoreV1Api(kb.new_client(srv.kubeconfig)).create_namespace({"metadata": {"name": kb.NS}})
            kb.creates_per_second(srv.kubeconfig, 1, 200, "warm", srv)
            return kb.creates_per_second(srv.kubeconfig, 1, n, "one", srv)
        finally:
            srv.close()


IN_PROCESS = """
import sys, time, orjson
from kubesim.store import Store
from kubesim.spec import ClusterSpec
sys.path.append(sys.argv[1])
from bench.kubesim_bench import pod_body
st = Store(ClusterSpec("x", []))
st.create("namespaces", {"metadata": {"name": "bench"}})
raws = [orjson.dumps(pod_body(f"p{i}")) for i in range(6000)]
for i, r in enumerate(raws):
    if i == 1000:
        t = time.process_time()
    o = orjson.loads(r)
    o["metadata"]["namespace"] = "bench"
    st.create_rec("pods", o)
print((time.process_time() - t) / 5000 * 1e6)
"""


def store_us(root: Path) -> float:
    """CPU-µs per pod ``Store.create_rec`` (no HTTP) of the kubesim under ``root``, in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, str(ROOT)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)}).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the older commit")
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "kubesim"], capture_output=True,
                             check=True).stdout
    with tempfile.TemporaryDirectory() as old:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
        figures: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            for label, root in (("before", Path(old)), ("after", ROOT)):
                rate, ms = measure(root, args.pods)
                figures[label].append(ms)
                print(f"{label} ({args.before if label == 'before' else 'this tree'}): pod creates/s 1 thread "
                      f"{rate:6.0f}, server {ms:.3f} CPU-ms each", flush=True)
        b, a = min(figures["before"]), min(figures["after"])
        print(f"best server CPU-ms per pod create: before {b:.3f}, after {a:.3f} ({(a - b) / b * 100:+.0f} %)")
        for _ in range(args.rounds):
            print(f"in-process Store.create_rec per pod: before {store_us(Path(old)):.1f} CPU-µs, "
                  f"after {store_us(ROOT):.1f} CPU-µs", flush=True)


if __name__ == "__main__":
    main()
