"""The processes a chaos run starts and hurts: one :class:`Service` per PID, plus private backends.

Everything here is a separate OS process started with ``subprocess.Popen``, so a fault is a signal
to a PID: ``kill -9`` (:meth:`Service.kill`), a freeze (:meth:`Service.freeze` = SIGSTOP, then
:meth:`Service.thaw` = SIGCONT) or a polite stop (SIGTERM). The broker and the database are PRIVATE
instances in the run's temporary directory on free ports: :class:`PrivateMosquitto` (its own config,
persistence on, as ``deploy/broker`` runs it) and :class:`PrivatePostgres` (``initdb`` + ``postgres``
from ``/usr/lib/postgresql/<v>/bin``). The shared PostgreSQL on 5432 and Mosquitto on 1883 are never
touched. :func:`missing_binaries` says what a scenario cannot run without, for a clear skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGKILL when the runner dies, so a killed test run leaves no federation behind
    (the children run in sessions of their own, out of reach of the runner's process group)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


def no_backends() -> bool:
    """``MKD_TEST_NO_SERVICES=1`` (as for the rest of the suite): behave as on a machine without them."""
    return bool(os.environ.get("MKD_TEST_NO_SERVICES"))


def postgres_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<v>/bin`` holding initdb and postgres (or ``MKD_CHAOS_PG_BINDIR``)."""
    if no_backends():
        return None
    env = os.environ.get("MKD_CHAOS_PG_BINDIR")
    candidates = [env] if env else sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                          key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
                                          reverse=True)
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "postgres").exists():
            return Path(c)
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("postgres") else None


def mosquitto_binary() -> str | None:
    if no_backends():
        return None
    return os.environ.get("MKD_CHAOS_MOSQUITTO") or shutil.which("mosquitto") or \
        (("/usr/sbin/mosquitto") if Path("/usr/sbin/mosquitto").exists() else None)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def missing_binaries(*, postgres: bool = False, mosquitto: bool = False) -> str | None:
    """Why a scenario needing these backends cannot run here, or None."""
    missing = []
    if postgres and postgres_bindir() is None:
        missing.append("PostgreSQL server binaries (initdb, postgres; e.g. apt-get install postgresql; "
                       "or set MKD_CHAOS_PG_BINDIR)")
    elif postgres and os.geteuid() == 0 and not _user_exists("postgres"):
        missing.append("a 'postgres' user to run PostgreSQL as (it refuses to run as root)")
    if mosquitto and mosquitto_binary() is None:
        missing.append("mosquitto (apt-get install mosquitto; or set MKD_CHAOS_MOSQUITTO)")
    return "missing " + " and ".join(missing) if missing else None


@dataclass
class Service:
    """One OS process, restartable, with its output in ``logs/<name>.log`` (appended across restarts)."""

    name: str
    argv: list[str]
    logs: Path
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    """Run as this user (setuid in the child, so the PID is the program's own): PostgreSQL refuses root."""
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    frozen: bool = False
    held: bool = False
    """Down on purpose (a fault script killed or stopped it and will start it again)."""
    crashes: list[str] = field(default_factory=list)
    """Exits nobody asked for, noted by :meth:`restart_if_crashed`."""

    @property
    def log_path(self) -> Path:
        return self.logs / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.logs.mkdir(parents=True, exist_ok=True)
        argv = self.argv
        with self.log_path.open("ab") as log:
            log.write(f"\n===== chaos: start #{self.starts + 1} of {self.name} at {time.strftime('%H:%M:%S')}: "
                      f"{' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO),
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                                         start_new_session=True, user=self.user, group=self.user,
                                         extra_groups=[] if self.user else None,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.starts += 1
        self.frozen = False
        self.held = False

    def restart_if_crashed(self) -> bool:
        """Start again a process that exited by itself (as a Deployment would), noting why it ended."""
        if self.proc is None or self.held or self.alive:
            return False
        self.crashes.append(f"{self.name} exited with {self.proc.returncode} at {time.strftime('%H:%M:%S')}: "
                            + " | ".join(self.log_tail(3).splitlines()))
        self.start()
        return True

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)

    def send(self, sig: int, what: str) -> None:
        """Send ``sig`` to the PID, noting it in the log."""
        self.note(f"{what} ({signal.Signals(sig).name}) to {self.pid}")
        self._signal(sig)

    def note(self, text: str) -> None:
        """A line in this service's log, so the log shows when each fault hit it."""
        with self.log_path.open("ab") as log:
            log.write(f"===== chaos: {time.strftime('%H:%M:%S')} {text}\n".encode())

    def kill(self) -> None:
        """kill -9 the PID and reap it."""
        if not self.alive:
            return
        pid = self.pid
        self.held = True
        self._signal(signal.SIGCONT if self.frozen else 0)
        self._signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)
        self.note(f"kill -9 {pid}")

    def freeze(self) -> None:
        """SIGSTOP: the process stays, holds its sockets and says nothing (a silent partition)."""
        self.note(f"SIGSTOP {self.pid}")
        self._signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)
        self.frozen = False
        self.note(f"SIGCONT {self.pid}")

    def terminate(self, within: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``within`` seconds; returns the exit code."""
        if self.proc is None:
            return None
        self.held = True
        if self.alive:
            if self.frozen:
                self.thaw()
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(within)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def log_since_start(self) -> str:
        """This service's output since its latest start."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text.rpartition("===== chaos: start #")[2]

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def exited(self) -> str | None:
        """Why this service is not running when it should be, or None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"{self.name} (pid {self.pid}) exited with {self.proc.returncode}; last lines of {self.log_path}:\n" \
            + self.log_tail()


async def wait_until(check: object, what: str, within: float, service: Service | None = None) -> None:
    """Poll ``check()`` (sync callable) until true; fail naming ``what`` (and the service's log)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        if service is not None and (why := service.exited()):
            raise RuntimeError(f"{what}: {why}")
        await asyncio.sleep(0.1)
    tail = f"; last lines of {service.log_path}:\n{service.log_tail()}" if service else ""
    raise RuntimeError(f"{what}: not within {within:.0f}s{tail}")


class PrivateMosquitto:
    """A Mosquitto of our own on a free port, configured like deploy/broker (persistence, big queues)."""

    def __init__(self, root: Path, logs: Path) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise RuntimeError(missing_binaries(mosquitto=True))
        self.root = root
        self.port = free_port()
        data = root / "mosquitto"
        data.mkdir(parents=True, exist_ok=True)
        conf = data / "mosquitto.conf"
        conf.write_text("\n".join([
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {data}/",
            "autosave_interval 30",
            "max_queued_messages 100000",
            "max_inflight_messages 1000",
            "log_type error", "log_type warning", "log_type notice",
            "log_dest stdout",
            # As root it would switch to user "mosquitto", which also drops the die-with-the-runner signal.
            *(["user root"] if os.geteuid() == 0 else []), "",
        ]))
        self.service = Service("mosquitto", [binary, "-c", str(conf)], logs)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.service.start()
        await wait_until(lambda: port_open(self.port), f"mosquitto on port {self.port}", 15, self.service)

    async def restart(self, *, kill: bool = False, down_seconds: float = 0.0) -> None:
        """Stop (SIGTERM: it saves its sessions; ``kill``: kill -9, the last autosave only) and start again."""
        if kill:
            self.service.kill()
        else:
            self.service.terminate()
        await asyncio.sleep(down_seconds)
        await self.start()

    def stop(self) -> None:
        self.service.terminate()


def bridge_to(site: PrivateMosquitto, core_port: int, topic_root: str, name: str) -> None:
    """Configure ``site`` (not started yet) as an agents' broker bridged to the Mosquitto on ``core_port``,
    with the settings docs/SCALING.md gives: QoS 1 both ways, a persistent bridge session, retained
    presence carried to the core."""
    conf = site.root / "mosquitto" / "mosquitto.conf"
    conf.write_text(conf.read_text() + "\n".join([
        "connection mkd-core", f"address 127.0.0.1:{core_port}", "bridge_protocol_version mqttv311",
        "cleansession false", f"remote_clientid {name}", f"local_clientid {name}-bridge", "try_private true",
        "bridge_outgoing_retain true", "restart_timeout 1 10",
        f"topic {topic_root}/+/reports out 1", f"topic {topic_root}/+/presence out 1",
        f"topic {topic_root}/+/commands in 1", ""]))
    site.service.name = "mosquitto-site"


class PrivatePostgres:
    """``initdb`` a cluster in the run's directory and run ``postgres`` on a free loopback port.

    An outage is :meth:`crash` (SIGQUIT to the postmaster PID: immediate shutdown, every connection
    cut, crash recovery at the next start) or :meth:`freeze` (SIGSTOP to the postmaster and every
    backend: connections hang instead of failing).
    """

    def __init__(self, root: Path, logs: Path) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError(missing_binaries(postgres=True))
        self.bindir = bindir
        self.port = free_port()
        self.user: str | None = None
        self.own_root: Path | None = None
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root: run as "postgres", in a
            self.user = "postgres"  # directory of its own (the run's may sit under a 0700 parent)
            self.own_root = Path(tempfile.mkdtemp(prefix="mkd-chaos-pg-"))
            shutil.chown(self.own_root, self.user)
            root = self.own_root
        self.data = root / "pgdata"
        self.sockets = root / "pgsock"
        self.service = Service("postgres", [str(bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                                            "-k", str(self.sockets), "-c", "listen_addresses=127.0.0.1",
                                            "-c", "fsync=off", "-c", "max_connections=200"],
                               logs, user=self.user)
        self._frozen_pids: list[int] = []

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> None:
        for d in (self.data, self.sockets):
            d.mkdir(parents=True, exist_ok=True)
            if self.user:
                shutil.chown(d, self.user)
        argv = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                "--no-sync"]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, user=self.user, group=self.user,
                              extra_groups=[] if self.user else None, cwd="/")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr or done.stdout}")

    def accepting(self) -> bool:
        """``pg_isready``: the port opens before crash recovery ends ("the database system is starting up")."""
        done = subprocess.run([str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                              check=False, capture_output=True)
        return done.returncode == 0

    async def start(self) -> None:
        self.service.start()
        await wait_until(self.accepting, f"postgres accepting connections on port {self.port}", 60, self.service)

    def _children(self) -> list[int]:
        pid = self.service.pid
        if pid is None:
            return []
        try:
            import psutil

            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except Exception:
            return []

    async def crash(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster): clients see their connections drop."""
        self.service.note(f"SIGQUIT {self.service.pid} (immediate shutdown)")
        self.service._signal(signal.SIGQUIT)
        assert self.service.proc is not None
        try:
            self.service.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.service.kill()

    def freeze(self) -> None:
        self._frozen_pids = [p for p in [self.service.pid, *self._children()] if p]
        self.service.note(f"SIGSTOP {self._frozen_pids}")
        for pid in self._frozen_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self._frozen_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.service.note(f"SIGCONT {self._frozen_pids}")
        self._frozen_pids = []

    def stop(self) -> None:
        if self._frozen_pids:
            self.thaw()
        self.service.terminate()
        if self.own_root is not None:
            shutil.rmtree(self.own_root, ignore_errors=True)


def python_service(name: str, args: list[str], logs: Path) -> Service:
    """A Python process of this checkout (``python -m ...``), so a run measures the worktree it sits in."""
    return Service(name, [sys.executable, *args], logs, env={"PYTHONPATH": str(REPO)})
