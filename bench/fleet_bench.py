"""A fleet of N worker clusters on one dispatcher: what heartbeats, leases, placement and a restart cost.

Set-up, each in its own process: a private Mosquitto (as bench/chaos starts it), a database of its own on the
machine's PostgreSQL (127.0.0.1:5432), kubesim as the manager cluster, the dispatcher started as
``mkctl dispatcher`` starts it, N simulated clusters (``bench/fleet_sim.py``: a real agent's wire side, keys
registered with the dispatcher) spread over a few processes, and the Job creator. Phases: all online; idle
(heartbeats, leases, presence only); Jobs at a set rate that run a drawn time; one cluster falls silent; the
dispatcher is killed (kill -9) and started again. Every figure is printed with the load average.

    .venv/bin/python bench/fleet_bench.py -n 100
    .venv/bin/python bench/fleet_bench.py -n 1000 --procs 4 --rate 100 --jobs 3000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench.chaos.procs import PrivateMosquitto, bridge_to, free_port  # noqa: E402
from bench.chaos.world import settings_flags  # noqa: E402
from bench.dispatch_bench import creator_main, drop_postgres, fresh_postgres, setup_manager  # noqa: E402
from bench.fleet_sim import fleet_main  # noqa: E402
from dispatcher import db  # noqa: E402
from dispatcher.settings import DispatcherSettings  # noqa: E402
from federation import signing  # noqa: E402


def port_below_ephemeral() -> int:
    """A free port under Linux's ephemeral range (32768-60999) for the dispatcher's API: the fleet's own
    thousand MQTT connections take ephemeral ports while the dispatcher starts, and one of them took a
    port ``free_port`` had just handed out (the dispatcher then exits: address already in use)."""
    import random
    import socket
    for _ in range(100):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} {load()}] {text}", flush=True)


async def register(db_url: str, keys: dict[str, str]) -> None:
    """Every cluster's public key recorded as ``mkctl clusters register`` records it."""
    from datetime import UTC, datetime

    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    from dispatcher.db.queries import clusters as q
    engine = create_async_engine(db_url)
    try:
        async with async_sessionmaker(engine)() as s, s.begin():
            now = datetime.now(UTC)
            for name, public in keys.items():
                await q.register_cluster(s, name, public, now)
    finally:
        await engine.dispose()


def pg_rows(dbname: str) -> int:
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-At", "-c",
                          "select tup_inserted + tup_updated + tup_deleted from pg_stat_database "
                          f"where datname = '{dbname}'"], capture_output=True, text=True, check=True)
    return int(out.stdout.strip() or 0)


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 1e6


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def metric(text: str, name: str, labels: str = "") -> list[tuple[str, float]]:
    out = []
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if labels in (m.group(1) or ""):
            out.append((m.group(1) or "", float(m.group(2))))
    return out


def hist_quantile(text: str, name: str, q: float) -> float:
    """A quantile from a Prometheus histogram's buckets (linear within a bucket)."""
    buckets = sorted((float("inf") if le == "+Inf" else float(le), v) for le, v in
                     ((re.search(r'le="([^"]+)"', lab).group(1), v)  # type: ignore[union-attr]
                      for lab, v in metric(text, name + "_bucket")))
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    want = q * buckets[-1][1]
    lo_le, lo_n = 0.0, 0.0
    for le, n in buckets:
        if n >= want:
            if le == float("inf"):
                return lo_le
            return lo_le + (le - lo_le) * ((want - lo_n) / max(1e-9, n - lo_n))
        lo_le, lo_n = le, n
    return float("nan")


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="mkd-fleet-"))
        self.root = f"fleet-{uuid.uuid4().hex[:6]}/v1"
        self.n = args.n
        self.names = [f"c{i:04d}" for i in range(self.n)]
        self.keys = {name: signing.generate() for name in self.names}
        self.dkey = signing.generate()
        self.api_port = port_below_ephemeral()
        self.results: dict[str, Any] = {"n": self.n}
        self.dispatcher: subprocess.Popen[bytes] | None = None
        self.fleets: list[tuple[Any, Any]] = []
        self.ctx = multiprocessing.get_context("spawn")
        self.silenced: set[str] = set()

    # --- processes --------------------------------------------------------------------------
    def start_dispatcher(self) -> None:
        values: dict[str, Any] = {
            "database_url": self.db_url,
            "mqtt": {"url": self.mqtt_url, "topic_root": self.root, "client_id": "fleet-dispatcher"},
            "signing": {"private_key": self.dkey[0]},
            "api_port": self.api_port, "api_host": "127.0.0.1",
            "heartbeat_timeout_seconds": self.args.heartbeat_timeout,
            "lease_seconds": self.args.lease_seconds,
            "lease_margin_seconds": self.args.lease_margin,
            "worker_lost_timeout_seconds": self.args.lost_timeout,
        }
        flags, unknown = settings_flags(DispatcherSettings, values)
        assert not unknown, unknown
        log = open(self.tmp / "dispatcher.log", "ab")
        self.dispatcher = subprocess.Popen(
            [sys.executable, "-m", "mkctl.main", "dispatcher", "--kubeconfig", str(self.kubeconfig), *flags],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def figures(self) -> list[dict[str, Any]]:
        out = []
        for _, conn in self.fleets:
            conn.send(("figures", None))
            out.append(conn.recv())
        return out

    def merged(self) -> dict[str, Any]:
        placed: dict[str, list[tuple[str, float]]] = {}
        m: dict[str, Any] = {"msgs_in": 0, "msgs_out": 0, "finished": 0, "refused": 0, "connected": 0,
                             "running": {}, "leases": {}, "resyncs": {}}
        for f in self.figures():
            for uid, v in f["placed"].items():
                placed.setdefault(uid, []).extend(v)
            for k in ("msgs_in", "msgs_out", "finished", "refused", "connected"):
                m[k] += f[k]
            for k in ("running", "leases", "resyncs"):
                m[k].update(f[k])
        m["placed"] = placed
        return m

    def wait(self, check: Any, within: float, what: str, step: float = 0.5) -> float:
        t0 = time.time()
        while time.time() - t0 < within:
            if check():
                return time.time() - t0
            time.sleep(step)
        say(f"!! {what}: not within {within:.0f}s")
        return float("nan")

    def metrics(self) -> str:
        try:
            return scrape(self.api_port)
        except OSError:
            return ""

    def online(self) -> int:
        return int(sum(v for _, v in metric(self.metrics(), "mkd_cluster_up")))

    # --- phases -----------------------------------------------------------------------------
    def setup(self) -> None:
        self.broker = PrivateMosquitto(self.tmp / "core", self.tmp)
        asyncio.run(self.broker.start())
        self.mqtt_url = self.agents_url = self.broker.url
        if self.args.bridge:  # the agents on a broker of their own, bridged to the dispatcher's (docs/SCALING.md)
            self.site = PrivateMosquitto(self.tmp / "site", self.tmp)
            bridge_to(self.site, self.broker.port, self.root, f"fleet-site-{uuid.uuid4().hex[:6]}")
            asyncio.run(self.site.start())
            self.agents_url = self.site.url
        self.db_url, self.pg_name = asyncio.run(fresh_postgres())
        db.upgrade(self.db_url)
        asyncio.run(register(self.db_url, {n: k[1] for n, k in self.keys.items()}))
        self.sim = subprocess.Popen([sys.executable, "-m", "kubesim", "--clusters", "manager", "--nodes", "1",
                                     "--state-dir", str(self.tmp / "sim")], cwd=ROOT, stdout=subprocess.PIPE,
                                    text=True)
        assert self.sim.stdout is not None
        for line in self.sim.stdout:
            if "ready" in line:
                break
        self.kubeconfig = next((self.tmp / "sim").glob("manager*kubeconfig*"))
        asyncio.run(setup_manager(self.kubeconfig))
        say(f"N={self.n}: broker {self.mqtt_url}, database {self.pg_name}, kubesim up")
        self.start_dispatcher()
        procs = max(1, min(self.args.procs, self.n))
        for p in range(procs):
            mine = {n: self.keys[n][0] for n in self.names[p::procs]}
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(target=fleet_main, daemon=True, args=(
                self.agents_url, self.root, mine, self.dkey[1], self.args.interval,
                (self.args.run_min, self.args.run_max), p, child))
            proc.start()
            self.fleets.append((proc, parent))

    def phase_online(self) -> None:
        assert self.dispatcher is not None
        t = self.wait(lambda: self.online() >= self.n, 180 + self.n * 0.2, "all clusters online", 1.0)
        self.results["online_s"] = t
        say(f"all {self.n} clusters online after {t:.1f}s (dispatcher RSS {rss_mb(self.dispatcher.pid):.0f} MB)")

    def phase_idle(self) -> None:
        assert self.dispatcher is not None
        time.sleep(self.args.interval)  # the start's work done
        secs = self.args.idle
        c0, m0, r0, f0 = cpu(self.dispatcher.pid), cpu(self.broker.service.pid or 0), pg_rows(self.pg_name), \
            self.merged()
        spy = None
        if self.args.profile:  # py-spy samples the dispatcher from outside (the dev extra installs it)
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p",
                                    str(self.dispatcher.pid), "-d", str(int(secs)), "-f", "raw", "-r", "50",
                                    "-o", str(self.args.profile)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        time.sleep(secs)
        if spy is not None:
            spy.wait(30)
        c1, m1, r1, f1 = cpu(self.dispatcher.pid), cpu(self.broker.service.pid or 0), pg_rows(self.pg_name), \
            self.merged()
        res = {"idle_cpu_pct": 100 * (c1 - c0) / secs, "idle_mosq_cpu_pct": 100 * (m1 - m0) / secs,
               "idle_pg_rows_s": (r1 - r0) / secs, "idle_rss_mb": rss_mb(self.dispatcher.pid),
               "idle_msgs_s": (f1["msgs_in"] + f1["msgs_out"] - f0["msgs_in"] - f0["msgs_out"]) / secs,
               "connections": len(psutil.Process(self.broker.service.pid or 0).net_connections(kind="tcp")),
               "idle_load": load()}
        self.results.update(res)
        say(f"idle {secs:.0f}s: dispatcher CPU {res['idle_cpu_pct']:.1f}% of a core, RSS {res['idle_rss_mb']:.0f} MB, "
            f"PostgreSQL {res['idle_pg_rows_s']:.1f} rows/s, Mosquitto CPU {res['idle_mosq_cpu_pct']:.1f}% with "
            f"{res['connections']} TCP connections, {res['idle_msgs_s']:.0f} fleet messages/s")

    def phase_jobs(self) -> None:
        assert self.dispatcher is not None
        n, rate = self.args.jobs, self.args.rate
        go, results = self.ctx.Event(), self.ctx.Queue()
        creator = self.ctx.Process(target=creator_main, daemon=True,
                                   args=(str(self.kubeconfig), n, 32, rate, go, results))
        creator.start()
        before = set(self.merged()["placed"])
        c0, m0, r0 = cpu(self.dispatcher.pid), cpu(self.broker.service.pid or 0), pg_rows(self.pg_name)
        t0 = time.time()
        if self.args.profile_jobs:  # py-spy samples the dispatcher while the Jobs arrive and some time after
            subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(self.dispatcher.pid),
                              "-d", str(int(n / max(rate, 1)) + 30), "-f", "raw", "-r", "50",
                              "-o", str(self.args.profile_jobs)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        go.set()
        if self.args.broker_restart:  # halfway through the Jobs, the agents' broker stops (SIGTERM) for 2 s
            time.sleep(n / max(rate, 1) / 2)
            broker = self.site if self.args.bridge else self.broker
            say(f"restarting the agents' broker ({broker.service.name}), 2 s down")
            asyncio.run(broker.restart(down_seconds=2.0))
        created, tc0, tc1 = results.get(True, n / max(rate, 1) + 300)
        uids = {u for u, _ in created}

        def all_placed() -> bool:
            self._last = self.merged()
            return len(uids & set(self._last["placed"])) >= len(uids)
        t_all = self.wait(all_placed, 120 + n / 20, "every Job placed", 1.0)
        t1 = time.time()
        c1, m1, r1 = cpu(self.dispatcher.pid), cpu(self.broker.service.pid or 0), pg_rows(self.pg_name)
        f = self._last
        at = dict(created)
        lat = [min(t for _, t in f["placed"][u]) - at[u] for u in uids if u in f["placed"]]
        # sustained: from the first Job's creation to the last Job's first Place at its agent
        firsts = [min(t for _, t in f["placed"][u]) for u in uids if u in f["placed"]]
        span = (max(firsts) - min(at.values())) if firsts else float("nan")
        text = self.metrics()
        wall = t1 - t0
        res = {
            "jobs": n, "rate_asked": rate, "created_rate": n / max(1e-9, tc1 - tc0),
            "placed": len(uids & set(f["placed"])), "lost": len(uids - set(f["placed"])),
            "placed_twice": sum(1 for u in uids if len({c for c, _ in f["placed"].get(u, [])}) > 1),
            "place_repeats": sum(len(f["placed"].get(u, [])) - len({c for c, _ in f["placed"].get(u, [])})
                                 for u in uids),
            "placed_rate": len(uids & set(f["placed"])) / max(1e-9, wall),
            "placed_rate_span": len(firsts) / max(1e-9, span),
            "last_placed_after_last_created_s": t_all - (tc1 - t0) if t_all == t_all else float("nan"),
            "e2e_p50_ms": 1000 * pct(lat, 0.5), "e2e_p99_ms": 1000 * pct(lat, 0.99),
            "admit_p50_ms": 1000 * hist_quantile(text, "mkd_admission_latency_seconds", 0.5),
            "admit_p99_ms": 1000 * hist_quantile(text, "mkd_admission_latency_seconds", 0.99),
            "jobs_cpu_ms_per_job": 1000 * (c1 - c0) / max(1, n), "jobs_cpu_pct": 100 * (c1 - c0) / wall,
            "jobs_mosq_cpu_pct": 100 * (m1 - m0) / wall, "jobs_pg_rows_s": (r1 - r0) / wall,
            "jobs_rss_mb": rss_mb(self.dispatcher.pid), "jobs_load": load(),
            "already_placed_before": len(before & uids),
        }
        self.results.update(res)
        say(f"jobs: {n} created at {res['created_rate']:.0f}/s (asked {rate:g}/s), {res['placed']} placed, "
            f"{res['lost']} lost, {res['placed_twice']} on two clusters, {res['place_repeats']} Places received again; {res['placed_rate']:.0f} placed/s over "
            f"{wall:.0f}s ({res['placed_rate_span']:.0f}/s from the first creation to the last Place); creation->Place at the agent p50 {res['e2e_p50_ms']:.0f} ms p99 {res['e2e_p99_ms']:.0f} ms; "
            f"claim->Place sent (mkd_admission_latency_seconds) p50 {res['admit_p50_ms']:.0f} ms p99 "
            f"{res['admit_p99_ms']:.0f} ms; dispatcher {res['jobs_cpu_ms_per_job']:.1f} CPU-ms/Job "
            f"({res['jobs_cpu_pct']:.0f}% of a core), Mosquitto {res['jobs_mosq_cpu_pct']:.0f}%, PostgreSQL "
            f"{res['jobs_pg_rows_s']:.0f} rows/s, RSS {res['jobs_rss_mb']:.0f} MB")
        creator.terminate()

    def phase_silent(self) -> None:
        f = self.merged()
        victim = max(f["running"], key=lambda c: len(f["running"][c]))
        jobs = list(f["running"][victim])
        k = next(i for i, name in enumerate(self.names) if name == victim) % len(self.fleets)
        conn = self.fleets[k][1]
        self.silenced.add(victim)
        conn.send(("silence", victim))
        conn.recv()
        t0 = time.time()
        say(f"silent: {victim} (running {len(jobs)} Jobs) stops heartbeating and answering")
        gone = self.wait(lambda: any(v == 0 for _, v in metric(self.metrics(), "mkd_cluster_up", f'"{victim}"')),
                         300, "silent cluster noticed", 0.5)

        def replaced() -> bool:
            g = self.merged()
            return all(any(c != victim for c, _ in g["placed"].get(u, [])) for u in jobs)
        moved = self.wait(replaced, self.args.lease_seconds + 240, "its Jobs re-placed", 1.0) if jobs else 0.0
        self.results.update({"silent_noticed_s": gone, "silent_replaced_s": (time.time() - t0) if moved == moved
                             else float("nan"), "silent_jobs": len(jobs), "silent_load": load()})
        say(f"silent cluster noticed after {gone:.1f}s (heartbeat every {self.args.interval:g}s, timeout "
            f"{self.args.heartbeat_timeout:g}s); its {len(jobs)} running Jobs re-placed after "
            f"{self.results['silent_replaced_s']:.1f}s (lease {self.args.lease_seconds:g}s + margin "
            f"{self.args.lease_margin:g}s, worker_lost_timeout {self.args.lost_timeout:g}s)")

    def phase_restart(self) -> None:
        assert self.dispatcher is not None
        f0 = self.merged()
        self.dispatcher.kill()  # kill -9
        self.dispatcher.wait()
        t0 = time.time()
        self.start_dispatcher()
        live = [c for c in self.names if c not in self.silenced]

        def synced() -> bool:
            self._last = self.merged()
            return all(self._last["leases"][c][1] > t0 for c in live)
        t = self.wait(synced, 300, "every cluster renewed by the new dispatcher", 1.0)
        f1 = self._last
        msgs = f1["msgs_in"] + f1["msgs_out"] - f0["msgs_in"] - f0["msgs_out"]
        base = self.results.get("idle_msgs_s", 0.0) * (t if t == t else 0.0)
        resyncs = sum(f1["resyncs"][c][0] - f0["resyncs"][c][0] for c in live)
        self.results.update({"restart_sync_s": t, "restart_msgs": msgs, "restart_msgs_over_idle": msgs - base,
                             "restart_resyncs": resyncs, "restart_rss_mb": rss_mb(self.dispatcher.pid),
                             "restart_load": load()})
        say(f"kill -9 + start: every live cluster's lease renewed by the new dispatcher after {t:.1f}s; "
            f"{msgs} messages meanwhile ({msgs - base:.0f} above idle), {resyncs} Resyncs")

    def stop(self) -> None:
        for proc, conn in self.fleets:
            with contextlib.suppress(Exception):
                conn.send(("stop", None))
            proc.terminate()
        if self.dispatcher is not None:
            self.dispatcher.terminate()
            with contextlib.suppress(Exception):
                self.dispatcher.wait(15)
        with contextlib.suppress(Exception):
            self.sim.terminate()
        with contextlib.suppress(Exception):
            self.broker.stop()
        with contextlib.suppress(Exception):
            self.site.stop()
        with contextlib.suppress(Exception):
            asyncio.run(drop_postgres(self.pg_name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=100, help="simulated worker clusters")
    p.add_argument("--procs", type=int, default=3, help="processes the simulated clusters are spread over")
    p.add_argument("--interval", type=float, default=10.0, help="heartbeat interval, seconds")
    p.add_argument("--idle", type=float, default=30.0, help="seconds of the idle phase")
    p.add_argument("--rate", type=float, default=100.0, help="Jobs created per second")
    p.add_argument("--jobs", type=int, default=3000, help="Jobs created")
    p.add_argument("--run-min", type=float, default=20.0, help="shortest Job run time, seconds")
    p.add_argument("--run-max", type=float, default=120.0, help="longest Job run time, seconds")
    p.add_argument("--heartbeat-timeout", type=float, default=30.0)
    p.add_argument("--lease-seconds", type=float, default=40.0)
    p.add_argument("--lease-margin", type=float, default=5.0)
    p.add_argument("--lost-timeout", type=float, default=30.0,
                   help="worker_lost_timeout_seconds: a lost cluster's accepted Jobs are placed again after this")
    p.add_argument("--skip", default="", help="phases to skip, comma separated: jobs,silent,restart")
    p.add_argument("--bridge", action="store_true",
                   help="the simulated clusters on a Mosquitto of their own, bridged (QoS 1) to the dispatcher's")
    p.add_argument("--broker-restart", action="store_true",
                   help="restart the agents' broker (SIGTERM, 2 s down) halfway through the Jobs")
    p.add_argument("--profile-jobs", type=Path, help="py-spy record the dispatcher during the Jobs phase (raw)")
    p.add_argument("--profile", type=Path, help="py-spy record the idle dispatcher into this file (raw, folded)")
    p.add_argument("--json", type=Path, help="append the figures as one JSON line to this file")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    run = Run(args)
    say(f"fleet_bench N={args.n} on {os.cpu_count()} cores")
    try:
        run.setup()
        run.phase_online()
        run.phase_idle()
        if "jobs" not in skip:
            run.phase_jobs()
        if "silent" not in skip:
            run.phase_silent()
        if "restart" not in skip:
            run.phase_restart()
    finally:
        run.stop()
    print(json.dumps(run.results))
    if args.json:
        with args.json.open("a") as fh:
            fh.write(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **run.results}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
