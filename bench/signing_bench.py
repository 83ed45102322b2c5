"""What signing and sealing cost per message: seal (dispatcher / agent) and open (receiver), next to encode
and decode; for a Place also its encryption to the agent's key (``federation.sealing``).

    .venv/bin/python bench/signing_bench.py          # 5,000 of each

Prints per-message CPU microseconds for a Place of a 2-replica PyTorchJob, a Status and a Heartbeat,
then for the Place: encrypt (dispatcher) and decrypt (agent), in the steady state (the dispatcher's
ephemeral key reused for a minute, both sides' wrapping key memoised) and with a fresh agreement on
each message (what the first Place to a cluster in a minute costs, or every one with the cache off).
Results go in bench/RESULTS.md with the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from federation import messages, sealing, signing


def place() -> messages.Place:
    def replica(n: int) -> dict[str, object]:
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [
            {"name": "pytorch", "image": "example/train:1", "env": [{"name": f"E{i}", "value": "x" * 20}
                                                                    for i in range(10)],
             "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}
    return messages.Place(placement=messages.PlacementKey(workload_uid="u" * 36, attempt=1, epoch=3), spec_version=1,
                          job=messages.JobRef(kind="PyTorchJob", api_version="kubeflow.org/v1", namespace="default",
                                              name="bench"),
                          manifest={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                    "metadata": {"name": "bench", "namespace": "default"},
                                    "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(1)}}})


def cpu_us(fn: object, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5000)
    n = parser.parse_args().n
    private, public = signing.generate()
    sealer = signing.Sealer(signing.parse_private_key(private))
    keys = [signing.parse_public_key(public)]
    key = messages.PlacementKey(workload_uid="u" * 36, attempt=1, epoch=3)
    samples = {
        "Place": (messages.encode, messages.decode_command, place()),
        "Status": (messages.encode, messages.decode_report,
                   messages.Status(cluster="worker-1", placement=key, seq=1, status={"conditions": [
                       {"type": "Running", "status": "True", "reason": "Running"}]})),
        "Heartbeat": (messages.encode, messages.decode_report, messages.Heartbeat(cluster="worker-1")),
    }
    print(f"load average {os.getloadavg()[0]:.1f} / {os.getloadavg()[1]:.1f}; {n} messages each; CPU µs per message")
    print(f"{'message':10} {'bytes':>6} {'encode':>8} {'seal':>8} {'open':>8} {'decode':>8}  seal+open vs encode+decode")
    topic = "mkd/v1/worker-1/commands"
    for name, (enc, dec, msg) in samples.items():
        body = enc(msg)
        counter = iter(range(1, 10**9))
        wire = sealer.seal(topic, body, stream="s", n=0)
        opener = signing.Opener()
        t_enc = cpu_us(lambda msg=msg, enc=enc: enc(msg), n)
        t_seal = cpu_us(lambda body=body, counter=counter: sealer.seal(topic, body, stream="s", n=next(counter)), n)
        sealed = [sealer.seal(topic, body, stream="s", n=next(counter)) for _ in range(n)]
        it = iter(sealed)
        t_open = cpu_us(lambda opener=opener, it=it: opener.open(topic, next(it), keys), n)
        t_dec = cpu_us(lambda body=body, dec=dec: dec(body), n)
        print(f"{name:10} {len(wire):>6} {t_enc:>8.1f} {t_seal:>8.1f} {t_open:>8.1f} {t_dec:>8.1f}  "
              f"{(t_seal + t_open) / (t_enc + t_dec):.1f}x")
    seal_places(n, private, topic)
    batches(n, sealer, keys, samples["Status"][2])  # type: ignore[arg-type]


def batches(n: int, sealer: signing.Sealer, keys: list[object], status: messages.Status) -> None:
    """Several Reports per message: per Report, the agent's encode + seal and the dispatcher's
    open + decode, for batches of 1 (a single Report, as before), 10 and 50 Statuses."""
    topic = "mkd/v1/worker-1/reports"
    print("\nStatus Reports per message; CPU µs per Report")
    print(f"{'per message':12} {'send':>8} {'receive':>8} {'sum':>8}")
    for size in (1, 10, 50):
        rounds = max(n // size, 1)
        counter = iter(range(1, 10**9))

        def send(size: int = size, counter: object = counter) -> bytes:
            first = next(counter)  # type: ignore[call-overload]
            if size == 1:
                return sealer.seal(topic, messages.encode(messages.numbered(status, "s", first)), stream="s", n=first)
            parts = [messages.encode_numbered(status, "s", first + i) for i in range(size)]
            for _ in range(size - 1):
                next(counter)  # type: ignore[call-overload]
            return sealer.seal(topic, messages.encode_reports(parts), stream="s", n=first + size - 1)
        t_send = cpu_us(send, rounds) / size
        wires = [send() for _ in range(rounds)]
        opener, it = signing.Opener(), iter(wires)

        def receive(opener: signing.Opener = opener, it: object = it) -> None:
            messages.decode_reports(opener.open(topic, next(it), keys).body)  # type: ignore[call-overload,arg-type]
        t_receive = cpu_us(receive, rounds) / size
        print(f"{size:>12} {t_send:>8.1f} {t_receive:>8.1f} {t_send + t_receive:>8.1f}")


def seal_places(n: int, agent_private: str, topic: str) -> None:
    """A Place encrypted to the agent's key (dispatcher) and decrypted (agent), steady state and cold."""
    body = messages.encode(place())
    agent_key = signing.parse_private_key(agent_private)
    to = sealing.recipients([agent_key.public_key()])
    warm_sealer, warm_opener = sealing.PlaceSealer(), sealing.PlaceOpener(agent_key)
    t_warm_seal = cpu_us(lambda: warm_sealer.seal(topic, body, to), n)
    sealed = [warm_sealer.seal(topic, body, to) for _ in range(n)]
    it = iter(sealed)
    t_warm_open = cpu_us(lambda: warm_opener.open(topic, next(it)), n)
    cold = max(n // 5, 1)
    t_cold_seal = cpu_us(lambda: sealing.PlaceSealer().seal(topic, body, to), cold)
    fresh = [sealing.PlaceSealer().seal(topic, body, to) for _ in range(cold)]
    it2 = iter(fresh)
    t_cold_open = cpu_us(lambda: warm_opener.open(topic, next(it2)), cold)
    print(f"\nPlace sealed to the agent's key: {len(body)} bytes -> {len(sealed[0])} bytes; CPU µs per Place")
    print(f"{'':22} {'encrypt':>8} {'decrypt':>8} {'sum':>8}")
    print(f"{'steady (key reused)':22} {t_warm_seal:>8.1f} {t_warm_open:>8.1f} {t_warm_seal + t_warm_open:>8.1f}")
    print(f"{'fresh agreement':22} {t_cold_seal:>8.1f} {t_cold_open:>8.1f} {t_cold_seal + t_cold_open:>8.1f}")


if __name__ == "__main__":
    main()
