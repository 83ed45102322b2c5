"""What one QoS 1 message costs the MQTT link itself (``federation.mqtt``: aiomqtt and paho), per side.

    .venv/bin/python bench/mqtt_bench.py [-n 5000] [--size 5000] [--concurrency 4]

A publisher link and a subscriber link, each in its own process (as the agent and the dispatcher are), on
Mosquitto at 127.0.0.1:1883 (a topic of their own). The publisher keeps ``--concurrency`` publishes awaiting
their PUBACK at once (the agent's outbox keeps at most 4 batches out); the subscriber iterates
``MqttLink.messages()``. Prints each process's CPU microseconds per message: what a message costs apart from
what is in it (encoding, signing and decoding are in bench/signing_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from federation.mqtt import MqttLink
from federation.settings import MqttSettings

URL = "mqtt://127.0.0.1:1883"


def subscriber(topic: str, n: int, ready: multiprocessing.Event, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def run() -> None:
        async with MqttLink(MqttSettings(url=URL), client_id=f"{topic}-sub", persistent=False) as link:
            await link.subscribe(topic)
            ready.set()
            got = 0
            start = 0.0
            async for _ in link.messages():
                if got == 0:
                    start = time.process_time()
                got += 1
                if got == n:
                    break
            out.put(("subscriber", (time.process_time() - start) / (n - 1) * 1e6))
    asyncio.run(run())


def publisher(topic: str, n: int, size: int, concurrency: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def run() -> None:
        async with MqttLink(MqttSettings(url=URL), client_id=f"{topic}-pub", persistent=False) as link:
            payload = b"x" * size
            start = time.process_time()
            left = iter(range(n))

            async def one() -> None:
                for _ in left:
                    await link.publish(topic, payload)
            await asyncio.gather(*(one() for _ in range(concurrency)))
            out.put(("publisher", (time.process_time() - start) / n * 1e6))
    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--size", type=int, default=5000, help="payload bytes (a batch of Reports is ~5 KB)")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    topic = f"mkd-mqtt-bench-{uuid.uuid4().hex[:6]}"
    ready, out = multiprocessing.Event(), multiprocessing.Queue()
    sub = multiprocessing.Process(target=subscriber, args=(topic, args.n, ready, out))
    sub.start()
    ready.wait(30)
    pub = multiprocessing.Process(target=publisher, args=(topic, args.n, args.size, args.concurrency, out))
    pub.start()
    pub.join()
    sub.join(60)
    results = dict(out.get(timeout=5) for _ in range(2))
    print(f"{args.n} messages of {args.size} bytes, {args.concurrency} in flight; CPU µs per message: "
          f"publisher {results['publisher']:.1f}, subscriber {results['subscriber']:.1f}")


if __name__ == "__main__":
    main()
