"""A TCP relay: ``python -m devcluster.relay LISTEN_HOST:PORT TARGET_HOST:PORT``.

Real nodes of the dev cluster live in network namespaces and reach the host only at the host
bridge's address (198.18.0.1); the apiserver listens on 127.0.0.1. The relay listens on the
bridge's address and copies bytes both ways (TLS passes through untouched), as the load
balancer in front of a real cluster's apiservers does. It runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

CHUNK_BYTES = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until the reader's end; then pass the half-close on (the other direction may
    still carry an answer), and close on errors."""
    try:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        for w in (writer, up_writer):
            with contextlib.suppress(Exception):
                w.close()

    server = await asyncio.start_server(handle, *listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m devcluster.relay LISTEN_HOST:PORT TARGET_HOST:PORT",
              file=sys.stderr)
        return 2
    asyncio.run(serve(_addr(argv[0]), _addr(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
