"""``python -m bench.chaos.proxy --port P --upstream-port U``: a TCP relay that can cut a link silently.

An agent reaches the broker through its own relay process. SIGUSR1 starts a **silent partition**:
nothing is forwarded either way and nothing is closed (no FIN, no RST), new connections are accepted
but never reach the broker, exactly what a dropped route looks like to both ends: each side only finds
out through its own keepalive. SIGUSR2 heals it (connections that survived carry on; new ones reach the
broker again). The agent process itself keeps running, so it can notice and fence itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal


class Relay:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.open = asyncio.Event()
        self.open.set()

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self.open.wait()  # partitioned: hold the bytes, say nothing
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        await self.open.wait()  # a connection made during the partition never gets through
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(self.pipe(client_r, up_w), self.pipe(up_r, client_w))


async def serve(port: int, upstream_port: int) -> None:
    relay = Relay(upstream_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, relay.open.clear)
    loop.add_signal_handler(signal.SIGUSR2, relay.open.set)
    server = await asyncio.start_server(relay.handle, "127.0.0.1", port)
    print(f"proxy: 127.0.0.1:{port} -> 127.0.0.1:{upstream_port}", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
