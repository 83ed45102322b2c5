"""A private Mosquitto run with the shipped deploy/broker configuration and ACL (never the shared 1883 one).

Only what differs between a pod and this machine is rewritten: the mount paths (``/mosquitto/...`` →
a temporary directory), the listener port (a free one), and ``user root`` when the test runs as root
(Mosquitto would otherwise drop to a ``mosquitto`` user that cannot read the temporary files).
The password file is made with ``mosquitto_passwd`` and the TLS files by :mod:`tests.security.tls`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.security.tls import make_tls

BROKER_YAML = Path(__file__).resolve().parents[2] / "deploy" / "broker" / "mosquitto.yaml"
MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd")


def shipped() -> dict[str, Any]:
    """The broker manifests by kind/name."""
    docs = [d for d in yaml.safe_load_all(BROKER_YAML.read_text()) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateBroker:
    port: int
    ca: Path
    passwords: dict[str, str]

    def url(self) -> str:
        return f"mqtts://127.0.0.1:{self.port}"


@contextlib.contextmanager
def private_mosquitto(tmp: Path, users: list[str]) -> Iterator[PrivateBroker]:
    assert MOSQUITTO and MOSQUITTO_PASSWD
    config_map = shipped()["ConfigMap/mosquitto"]["data"]
    root = tmp / "mosquitto"
    for sub in ("config", "data", "auth", "certs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ca, _, _ = make_tls(root / "certs")
    passwords = {u: f"pw-{u}-{os.urandom(4).hex()}" for u in users}
    passwd = root / "auth" / "passwd"
    passwd.touch()
    for user, password in passwords.items():
        subprocess.run([MOSQUITTO_PASSWD, "-b", str(passwd), user, password], check=True, capture_output=True)
    port = free_port()
    for key, text in config_map.items():
        text = text.replace("/mosquitto/", f"{root}/")
        if key == "mosquitto.conf":
            text = re.sub(r"(?m)^listener \d+", f"listener {port}", text)
            if os.geteuid() == 0:
                text += "\nuser root\n"
        (root / "config" / key).write_text(text)
    log = open(root / "mosquitto.log", "wb")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(root / "config" / "mosquitto.conf")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"mosquitto did not start: {(root / 'mosquitto.log').read_text()}")
            time.sleep(0.05)
        yield PrivateBroker(port, ca, passwords)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
