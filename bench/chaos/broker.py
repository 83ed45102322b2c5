"""``python -m bench.chaos.broker --port P``: the embedded amqtt broker as a process of its own.

The fallback when Mosquitto is not installed, so a broker restart is still a fault on a PID. It keeps
no state across restarts (unlike the private Mosquitto, which persists its sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from federation.embedded_broker import EmbeddedBroker


async def serve(port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with EmbeddedBroker(port=port) as broker:
        print(f"broker: listening at {broker.url}", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
