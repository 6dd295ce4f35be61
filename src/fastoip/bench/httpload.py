"""HTTP/1.1 load: a minimal keep-alive client on asyncio protocols (uvloop when installed).

No HTTP library on the hot path: each request is the pre-built bytes from
:func:`fastoip.bench.inputs.encode_http` written to a connection; the
protocol parses just the status line, ``Content-Length`` (or chunked
encoding) and ``Connection: close``.  Closed loop: C connections, each sends
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


def _dechunk(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """(body, end) of a complete chunked body starting at ``start``; None if incomplete."""
    parts: list[bytes] = []
    pos = start
    while True:
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(bytes(buf[pos:line_end]).split(b";")[0], 16)
        pos = line_end + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)  # optional trailers end with an empty line
            return (b"".join(parts), end + 4) if end >= 0 else None
        if len(buf) < pos + size + 2:
            return None
        parts.append(bytes(buf[pos : pos + size]))
        pos += size + 2


class _Conn(asyncio.Protocol):
    """One keep-alive connection: parse responses, hand them to the owner."""

    def __init__(self, owner: HttpLoad) -> None:
        self.owner = owner
        self.transport: Any = None
        self.buf = bytearray()
        self.busy = False
        self.closed = False
        self.t0 = 0
        self._need = -1
        self._body_start = 0
        self._head = b""
        self._chunked = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, payload: bytes) -> None:
        self.busy = True
        self.owner.recorder.sent += 1
        self.t0 = now_ns()
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            if self._need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end]).lower()
                self._head = head
                self._body_start = end + 4
                at = head.find(b"\r\ncontent-length:")
                if at >= 0:
                    line_end = head.find(b"\r\n", at + 2)
                    self._need = end + 4 + int(head[at + 17 : line_end if line_end > 0 else len(head)])
                    self._chunked = False
                elif b"chunked" in head:
                    self._need = 0
                    self._chunked = True
                else:
                    self._need = end + 4
                    self._chunked = False
            if self._chunked:
                found = _dechunk(buf, self._body_start)
                if found is None:
                    return
                body, stop = found
            else:
                if len(buf) < self._need:
                    return
                body, stop = bytes(buf[self._body_start : self._need]), self._need
            del buf[:stop]
            head, self._need = self._head, -1
            self.busy = False
            self.owner.on_response(self, head, body)
            if not buf:
                return

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
    def on_response(self, conn: _Conn, head: bytes, body: bytes) -> None:
        t1 = now_ns()
        status = head[9:12]
        if status != b"200":
            self.recorder.error(t1, status.decode("latin-1") or "BAD_RESPONSE")
        elif len(body) in self._ok_lengths or self.spec.check.slow_ok(body, self._header_length(head)):
            self.recorder.ok(t1, t1 - conn.t0)
        else:
            self.recorder.error(t1, "BAD_RESPONSE")
        if b"\r\nconnection: close" in head:
            conn.transport.close()
            return
        if self._running and not self._open:
            conn.send(self._take())
        else:
            self._idle.append(conn)

    @staticmethod
    def _header_length(head: bytes) -> int | None:
        at = head.find(b"\r\ninference-header-content-length:")
        if at < 0:
            return None
        line_end = head.find(b"\r\n", at + 2)
        return int(head[at + 34 : line_end if line_end > 0 else len(head)])

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
