"""Running simulated clusters: one background thread with its own event loop serves all of them.

``serve(specs, state_dir)`` (sync) and ``serve_async(...)`` (async) start one HTTP server per
``ClusterSpec`` on a free loopback port, write a kubeconfig per cluster into ``state_dir``, start the
simulators from ``kubesim.sim`` when that package provides ``start``, and tear everything down on exit.
``Sim.stop_cluster`` / ``start_cluster`` take one cluster offline and back on the same port with its state.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kubesim.httpserver import HttpServer
from kubesim.server import ApiServer, Faults
from kubesim.spec import ClusterSpec
from kubesim.store import Store

log = logging.getLogger("kubesim")
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(path: Path, name: str, url: str, ca_pem: bytes | None = None) -> Path:
    """A kubeconfig with one cluster, one token user and one context, usable by kubectl and the client;
    ``ca_pem``: the CA an HTTPS server's certificate is checked against."""
    cluster: dict[str, Any] = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    cfg = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": f"{name}-admin", "user": {"token": f"kubesim-{name}"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin", "namespace": "default"}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


class SimCluster:
    """One simulated cluster: its store, faults, HTTP server and simulators (all on the sim loop)."""

    def __init__(self, spec: ClusterSpec, state_dir: Path, loop: asyncio.AbstractEventLoop,
                 port: int | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.loop = loop
        self._tls: ssl.SSLContext | None = None
        ca_pem: bytes | None = None
        if spec.tls:  # the root CA signs the serving certificate, as kubeadm's does
            from kubesim.testing import webhook_pki

            pki = webhook_pki(["localhost"], ips=("127.0.0.1",), days=3650)
            where = state_dir / f"{spec.name}-tls"
            where.mkdir(parents=True, exist_ok=True)
            (where / "tls.crt").write_bytes(pki.cert_pem)
            (where / "tls.key").write_bytes(pki.key_pem)
            (where / "tls.key").chmod(0o600)
            self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._tls.load_cert_chain(where / "tls.crt", where / "tls.key")
            ca_pem = pki.ca_pem
        self.store = Store(spec, root_ca=ca_pem.decode() if ca_pem else None)
        self.store.defer = loop.call_soon
        self.faults = Faults()
        self.server = ApiServer(self.store, self.faults)
        self.faults._drop = lambda: loop.call_soon_threadsafe(self.server.drop_watches)
        self.port = port or _free_port()
        self.url = f"{'https' if spec.tls else 'http'}://127.0.0.1:{self.port}"
        self.server.address = f"127.0.0.1:{self.port}"
        self.kubeconfig = write_kubeconfig(state_dir / f"{spec.name}.kubeconfig", spec.name, self.url, ca_pem)
        self._http: HttpServer | None = None
        self._sim: Any = None
        self.running = False

    async def start(self) -> None:
        if self.running:
            return
        self._http = self.server.http_server()
        await self._http.start("127.0.0.1", self.port, backlog=1024, ssl=self._tls)
        self.running = True
        self._sim = await _start_sim(self.store, self.spec, self.loop)
        self.server.logs = getattr(getattr(self._sim, "kubelet", None), "logs", None)

    async def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        if self._sim is not None:
            try:
                await self._sim.stop()
            except Exception:
                log.exception("kubesim: simulator stop failed for %s", self.name)
            self._sim = None
        self.server.drop_watches()
        if self._http is not None:
            await self._http.close()
            self._http = None


async def _start_sim(store: Store, spec: ClusterSpec, loop: asyncio.AbstractEventLoop) -> Any:
    try:
        from kubesim import sim  # the scheduler / kubelet / Job controller, written separately
    except ImportError:
        return None
    start = getattr(sim, "start", None)
    if start is None:
        return None
    handle = start(store, spec, loop)
    if asyncio.iscoroutine(handle):
        handle = await handle
    return handle


class Sim:
    """Handle on a set of running clusters; methods are safe to call from any thread except the sim loop."""

    def __init__(self, specs: list[ClusterSpec], state_dir: Path, ports: dict[str, int] | None = None) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate cluster names: {names}")
        self.specs = specs
        self.state_dir = Path(state_dir)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="kubesim-loop", daemon=True)
        self.clusters: dict[str, SimCluster] = {}
        self.ports = ports or {}

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        """Run a coroutine function on the sim loop and wait for its result."""
        async def wrap() -> T:
            return await fn()
        fut = asyncio.run_coroutine_threadsafe(wrap(), self.loop)
        return fut.result(timeout)

    def run(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run a plain function on the sim loop (e.g. to touch a store) and wait for its result."""
        async def wrap() -> T:
            return fn()
        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result(timeout)

    def open(self) -> Sim:
        self._thread.start()

        async def start_all() -> None:
            for spec in self.specs:
                c = SimCluster(spec, self.state_dir, self.loop, self.ports.get(spec.name))
                self.clusters[spec.name] = c
                await c.start()
        try:
            self.call(start_all)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if not self._thread.is_alive():
            return

        async def stop_all() -> None:
            for c in self.clusters.values():
                await c.stop()
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self.call(stop_all, timeout=15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()

    # -- the contract
    def cluster(self, name: str) -> SimCluster:
        return self.clusters[name]

    def kubeconfig(self, name: str) -> Path:
        return self.clusters[name].kubeconfig

    def url(self, name: str) -> str:
        return self.clusters[name].url

    def stop_cluster(self, name: str) -> None:
        self.call(self.clusters[name].stop)

    def start_cluster(self, name: str) -> None:
        self.call(self.clusters[name].start)

    async def stop_cluster_async(self, name: str) -> None:
        await asyncio.to_thread(self.stop_cluster, name)

    async def start_cluster_async(self, name: str) -> None:
        await asyncio.to_thread(self.start_cluster, name)

    @property
    def names(self) -> list[str]:
        return list(self.clusters)


@contextlib.contextmanager
def serve(specs: list[ClusterSpec], state_dir: Path | str, ports: dict[str, int] | None = None) -> Iterator[Sim]:
    """Serve ``specs`` until the block exits (sync callers); ``ports`` pins cluster ports."""
    sim = Sim(list(specs), Path(state_dir), ports).open()
    try:
        yield sim
    finally:
        sim.close()


@contextlib.asynccontextmanager
async def serve_async(specs: list[ClusterSpec], state_dir: Path | str,
                      ports: dict[str, int] | None = None) -> AsyncIterator[Sim]:
    """Serve ``specs`` until the block exits (async callers; the servers still run on their own thread)."""
    sim = await asyncio.to_thread(lambda: Sim(list(specs), Path(state_dir), ports).open())
    try:
        yield sim
    finally:
        await asyncio.to_thread(sim.close)
