"""HTTP/1.1 load: a minimal keep-alive client on asyncio protocols (uvloop when installed).

Each request is the pre-built bytes from :func:`fastoip.bench.inputs.encode_http`
written to a connection; responses are framed by httptools' response parser
(llhttp, C: Content-Length, chunked, keep-alive), no hand-written HTTP parsing.  Closed loop: C connections, each sends
its next request from the callback that completed the previous one.  Open
loop: a scheduler hands each request to an idle connection, opening a new one
when none is idle (HTTP/1.1 has no multiplexing).

Errors are counted by HTTP status code ("404", "503"), or
``CONNECTION_REFUSED`` / ``CONNECTION_ERROR`` / ``TIMEOUT`` / ``BAD_RESPONSE``.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import httptools

from .load import LATE_NS, LoadSpec, LoopThreadGenerator, Sample, now_ns, schedule
from .tls import ssl_context

#: Pause after a failed connect before the slot tries again (keeps a dead server from spinning the CPU).
RECONNECT_DELAY_S = 0.01


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class _Conn(asyncio.Protocol):
    """One keep-alive connection: httptools' response parser (llhttp) frames each response, the owner gets it.

    The parser handles Content-Length and chunked bodies, split reads and keep-alive; a response it cannot parse
    counts as ``BAD_RESPONSE`` and closes the connection.
    """

    def __init__(self, owner: HttpLoad) -> None:
        self.owner = owner
        self.transport: Any = None
        self.busy = False
        self.closed = False
        self.t0 = 0
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._header_length: int | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, payload: bytes) -> None:
        self.busy = True
        self.owner.recorder.sent += 1
        self.t0 = now_ns()
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self.busy:
                self.busy = False
                self.owner.recorder.error(now_ns(), "BAD_RESPONSE")
            self.transport.close()

    # httptools' parser callbacks ------------------------------------------------------
    def on_message_begin(self) -> None:
        self._body = []
        self._header_length = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 31 and name.lower() == b"inference-header-content-length":
            try:
                self._header_length = int(value)
            except ValueError:
                self._header_length = -1  # not a number: the slow check refuses the body

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        parts = self._body
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.busy = False
        parser = self._parser
        self.owner.on_response(self, parser.get_status_code(), self._header_length, parser.should_keep_alive(), body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.owner.on_lost(self)


class HttpLoad(LoopThreadGenerator):
    """Closed or open loop over keep-alive HTTP/1.1 connections."""

    thread_name = "fastoip-bench-http"

    def __init__(self, spec: LoadSpec) -> None:
        super().__init__(spec)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._running = False
        self._open = False
        self._next = 0
        self._conns: set = set()
        self._idle: list = []
        self._ok_lengths = spec.check.lengths
        #: https:// targets: one client context for every connection (its session cache resumes handshakes).
        self._ssl: ssl.SSLContext | None = ssl_context(spec.tls) if spec.tls is not None else None

    def _take(self) -> bytes:
        k = self._next
        self._next = k + 1 if k + 1 < len(self.spec.requests) else 0
        return self.spec.requests[k]

    # Callbacks from the connections ----------------------------------------------
    def on_response(self, conn: _Conn, status: int, header_length: int | None, keep_alive: bool, body: bytes) -> None:
        t1 = now_ns()
        if status != 200:
            self.recorder.error(t1, str(status) if status else "BAD_RESPONSE")
        elif len(body) in self._ok_lengths or self.spec.check.slow_ok(body, header_length):
            self.recorder.ok(t1, t1 - conn.t0)
        else:
            self.recorder.error(t1, "BAD_RESPONSE")
        if not keep_alive:  # Connection: close (or HTTP/1.0)
            conn.transport.close()
            return
        if self._running and not self._open:
            conn.send(self._take())
        else:
            self._idle.append(conn)

    def on_lost(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        if conn.busy:
            conn.busy = False
            self.recorder.error(now_ns(), "CONNECTION_ERROR")
        if self._running and not self._open and self._loop is not None:
            self._loop.create_task(self._slot())

    # Connections ------------------------------------------------------------------
    async def _connect(self) -> _Conn | None:
        assert self._loop is not None
        try:
            _, conn = await asyncio.wait_for(
                self._loop.create_connection(lambda: _Conn(self), self.spec.host, self.spec.port, ssl=self._ssl),
                timeout=self.spec.timeout_s,
            )
        except asyncio.TimeoutError:
            self.recorder.error(now_ns(), "TIMEOUT")
            return None
        except ConnectionRefusedError:
            self.recorder.error(now_ns(), "CONNECTION_REFUSED")
            return None
        except ssl.SSLError:
            self.recorder.error(now_ns(), "TLS_ERROR")
            return None
        except OSError:
            self.recorder.error(now_ns(), "CONNECTION_ERROR")
            return None
        self._conns.add(conn)
        return conn

    async def _slot(self) -> None:
        """Closed loop: open one connection (retrying) and start its request chain."""
        while self._running:
            conn = await self._connect()
            if conn is not None:
                if self._running:
                    conn.send(self._take())
                return
            await asyncio.sleep(RECONNECT_DELAY_S)

    async def _open_send(self, request: bytes) -> None:
        conn = await self._connect()
        if conn is not None:
            conn.send(request)

    async def _scheduler(self, rate: float) -> None:
        gaps = schedule(rate, self.spec.distribution, self.spec.seed)
        due = now_ns()
        while self._running:
            now = now_ns()
            if due > now:
                await asyncio.sleep((due - now) / 1e9)
                continue
            busy = len(self._conns) - len(self._idle)
            if busy >= self.spec.max_outstanding:
                await asyncio.sleep(0.0005)
                continue
            if now - due > LATE_NS:
                self.recorder.late += 1
            request = self._take()
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    conn.send(request)
                    break
            else:
                asyncio.ensure_future(self._open_send(request))
            due += int(next(gaps))

    async def _main(self, mode: str, level: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._running = True
        self._open = mode == "rate"
        tasks = []
        if self._open:
            tasks.append(asyncio.ensure_future(self._scheduler(level)))
        else:
            tasks += [asyncio.ensure_future(self._slot()) for _ in range(int(level))]
        self._ready.set()
        await self._stop_event.wait()
        self._running = False
        drain = self.spec.extra.get("drain_s", 10.0)
        deadline = now_ns() + int(drain * 1e9)
        while any(c.busy for c in self._conns) and now_ns() < deadline:
            await asyncio.sleep(0.005)
        for task in tasks:
            task.cancel()
        for conn in list(self._conns):
            if conn.busy:
                conn.busy = False
                self.recorder.error(now_ns(), "CANCELLED")
            if conn.transport is not None:
                conn.transport.close()
        await asyncio.sleep(0)

    def _run(self, mode: str, level: float) -> None:
        loop = _new_loop()
        try:
            loop.run_until_complete(self._main(mode, level))
        except BaseException as exc:  # noqa: BLE001
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    # The interface ------------------------------------------------------------------
    def cut(self, a: int, b: int) -> Sample:
        return self.recorder.cut(a, b)

    def stop(self, drain_s: float = 10.0) -> None:
        self.spec.extra["drain_s"] = drain_s
        if self._loop is not None and self._stop_event is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop_event.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(drain_s + 5)
