"""Two revisions of mkd end to end at the same time: ``bench/e2e_bench.py`` of each, run together, pair after pair.

A solo run of ``e2e_bench.py`` moves by ±10 % with the machine (on the shared 2-core machine the same code
read ratios 0.41-0.52 within 20 minutes, bench/RESULTS.md), so a change worth a few percent cannot be seen in
runs made one after the other. Run together, both federations share the two cores at the same moment and every
difference between them is the code's. Each figure is then about half a solo run's rate; compare B with A
only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.e2e_measure import pair_table  # noqa: E402


def export(revision: str, into: Path) -> str:
    """``revision`` of this repository's history extracted into ``into``; returns its commit."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{revision}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    with subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
            archive.extractall(into, filter="data")
    if proc.returncode:
        raise SystemExit(f"git archive {revision} failed")
    if "--json" not in (into / "bench" / "e2e_bench.py").read_text():
        raise SystemExit(f"{revision} ({commit[:10]}) predates e2e_bench.py --json, which this comparison reads: "
                         "compare revisions from the commit that added bench/e2e_pair.py on")
    return commit


async def one(tree: Path, n: int, state: Path, out: Path) -> dict[str, Any]:
    """``e2e_bench.py -n N`` of the exported ``tree``; its figures (``--json``)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = (state.parent / f"{state.name}.log").open("w")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(tree / "bench" / "e2e_bench.py"), "-n", str(n), "--state-dir", str(state),
        "--json", str(out), cwd=str(tree), env=env, stdout=log, stderr=subprocess.STDOUT)
    code = await proc.wait()
    log.close()
    if code:
        raise SystemExit(f"e2e_bench.py of {tree.name} exited {code}: see {log.name}")
    figures: list[dict[str, Any]] = json.loads(await asyncio.to_thread(out.read_text))
    return figures[0]


async def pairs(trees: tuple[Path, Path], n: int, count: int, work: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    done: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for i in range(1, count + 1):
        a, b = await asyncio.gather(*(one(tree, n, work / f"state-{tree.name}-{i}", work / f"{tree.name}-{i}.json")
                                      for tree in trees))
        done.append((a, b))
        print(f"pair {i}: A {a['e2e_rate']:.1f} jobs/s, {a['total_ms_per_job']:.2f} CPU-ms/job; "
              f"B {b['e2e_rate']:.1f} jobs/s, {b['total_ms_per_job']:.2f} CPU-ms/job", flush=True)
    return done


def main() -> None:
    """Each revision is exported (``git archive``) into a directory of its own and run from there with this
    environment's Python (the same packages for both); their services, state and PostgreSQL databases are their
    own. Prints, per pair and over all pairs, jobs/s and CPU per job of A and B and B's change
    (``bench.e2e_measure.pair_table``).

        python -m bench.e2e_pair main~3 main -n 4000 --pairs 3
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="revision A (the reference), e.g. main~1")
    parser.add_argument("b", help="revision B (the change), e.g. main")
    parser.add_argument("-n", type=int, default=4000, help="jobs per run (each of A and B); default 4000")
    parser.add_argument("--pairs", type=int, default=3, help="pairs run one after the other; default 3")
    parser.add_argument("--keep", action="store_true", help="keep the exported trees and the runs' logs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mkd-e2e-pair-"))
    try:
        trees = (work / "A", work / "B")
        commits = [export(rev, tree) for rev, tree in zip((args.a, args.b), trees, strict=True)]
        print(f"A = {args.a} ({commits[0][:10]}), B = {args.b} ({commits[1][:10]}); N = {args.n} each, run together; "
              f"{args.pairs} pairs", flush=True)
        from federation import eventloop

        done = eventloop.run(pairs(trees, args.n, args.pairs, work))
        print("\n".join(pair_table(done)))
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
