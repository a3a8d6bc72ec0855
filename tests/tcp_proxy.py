"""A small TCP proxy for network-fault tests (T7), run by asyncio in a thread of its own.

Put it between a client and a server (the client connects to :attr:`TcpProxy.port`) and
switch its mode while the client runs:

* ``pass``: bytes flow both ways;
* ``reset``: every open connection is closed with a TCP reset, and so is every new one;
* ``blackhole``: connections are accepted and kept, nothing is forwarded either way (what was
  read is held), no new upstream connection is opened; back in ``pass`` everything held flows,
  as after a network partition heals;
* ``slow``: bytes flow at most ``rate`` bytes per second in each direction of a connection.

:meth:`TcpProxy.sever` models a flow a firewall or a NAT silently forgot: the connections open
now forward nothing, ever, while new ones pass.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any

PASS, RESET, BLACKHOLE, SLOW = "pass", "reset", "blackhole", "slow"
MODES = (PASS, RESET, BLACKHOLE, SLOW)
_CHUNK = 65536


class _Link:
    """One proxied connection: the client's side and the server's side."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.severed = False
        self.tasks: list[asyncio.Task[None]] = []

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.server) if w is not None]


class TcpProxy:
    """Listens on 127.0.0.1 (``port``, or a free one) and forwards to ``upstream_port``."""

    def __init__(self, upstream_port: int, *, port: int = 0,
                 upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = PASS
        self.rate = 0
        self.connections = 0  # accepted so far
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._changed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="tcp-proxy")
        self._thread.start()
        self._call(self._listen(port))
        assert self._server is not None
        self.port: int = self._server.sockets[0].getsockname()[1]

    # --- control (from any thread) --------------------------------------------------------

    def set_mode(self, mode: str, *, rate: int = 0) -> None:
        """Switch to ``mode``; ``rate`` (bytes per second) for ``slow``."""
        if mode not in MODES:
            msg = f"unknown proxy mode {mode!r}: use one of {', '.join(MODES)}"
            raise ValueError(msg)
        if mode == SLOW and rate <= 0:
            msg = f"mode 'slow' needs a rate in bytes per second above 0 (got {rate})"
            raise ValueError(msg)
        self._call(self._switch(mode, rate))

    def sever(self) -> int:
        """Silently kill the connections open now (they forward nothing from here on and are
        never closed); new connections are not affected.  Returns how many were severed."""
        return int(self._call(self._sever()))

    def open_connections(self) -> int:
        return len(self._links)

    def close(self) -> None:
        if not self._loop.is_running():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- inside the loop ------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _listen(self, port: int) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)

    async def _switch(self, mode: str, rate: int) -> None:
        self.mode, self.rate = mode, rate
        if mode == RESET:
            for link in list(self._links):
                self._reset(link)
        self._changed.set()
        self._changed = asyncio.Event()

    async def _sever(self) -> int:
        for link in self._links:
            link.severed = True
        self._changed.set()
        self._changed = asyncio.Event()
        return len(self._links)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            self._reset(link)

    async def _gate(self, link: _Link) -> None:
        """Wait while the proxy (or this link) forwards nothing."""
        while link.severed or self.mode == BLACKHOLE:
            await self._changed.wait()

    def _reset(self, link: _Link) -> None:
        self._links.discard(link)
        for task in link.tasks:
            task.cancel()
        for writer in link.writers():
            sock = writer.get_extra_info("socket")
            if sock is not None:  # SO_LINGER 0: close() sends RST, not FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        self.connections += 1
        self._links.add(link)
        if self.mode == RESET:
            self._reset(link)
            return
        try:
            await self._gate(link)
            if self.mode == RESET or link not in self._links:
                self._reset(link)
                return
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self._reset(link)  # the server is down: the client sees a reset
            return
        link.server = up_writer
        link.tasks = [asyncio.create_task(self._pump(link, reader, up_writer)),
                      asyncio.create_task(self._pump(link, up_reader, writer))]

    async def _pump(self, link: _Link, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._gate(link)
                data = await reader.read(_CHUNK)
                if not data:
                    break
                while data:
                    await self._gate(link)  # what was read during a blackhole is held
                    slow = self.mode == SLOW
                    size = max(1, self.rate // 20) if slow else len(data)
                    writer.write(data[:size])
                    await writer.drain()
                    data = data[size:]
                    if slow:
                        await asyncio.sleep(size / self.rate)
        except (OSError, asyncio.IncompleteReadError):
            pass
        # one side ended: end the other too (FIN), unless the link was reset or severed
        if link in self._links and not link.severed:
            self._links.discard(link)
            for other in link.writers():
                other.close()
