"""One model call's answers on the event loop, in order: each response, then the end or the error.

The call runs through ``Core.start`` with a response sink, so a decoupled model's responses arrive as they are
produced and the loop never waits on a model; ``close()`` cancels a call still running (a client that went
away, a stop string met), which stops a decoupled model's generation.  Used by generate / generate_stream and by
the OpenAI routes (one wrapper for both).

Back-pressure: with ``max_pending``, at most that many responses wait unread; one more (the reader, a stream's
writer blocked on a client that reads nothing, fell that far behind) cancels the call with a log line, and the
reader gets a 429 error after the responses it had.  A model cannot be paused, so it is stopped.
"""

from __future__ import annotations

import asyncio
import logging

from ...core import Core, FinishedCall, on_loop
from ...errors import InferenceError, ResourceExhausted
from ...types import InferRequest, InferResponse

#: A response, the call's error, or None (no more answers).
Answer = InferResponse | InferenceError | None
log = logging.getLogger("fastoip.http")


class ModelCall:
    """A started request whose answers are awaited one by one."""

    def __init__(self, core: Core, request: InferRequest, max_pending: int = 0) -> None:
        self.queue: asyncio.Queue[Answer] = asyncio.Queue()
        self.max_pending = max_pending
        self.overflowed = False
        self.model = request.model_name
        hop = on_loop(asyncio.get_running_loop(), self._put if max_pending else self.queue.put_nowait)

        def on_response(job: FinishedCall, response: InferResponse) -> None:
            hop(response)

        def on_done(job: FinishedCall) -> None:
            if job.error is not None:
                hop(job.error)
            elif job.response is not None:
                hop(job.response)
            hop(None)

        self.ticket = core.start(request, None, on_done, on_response)
        self.ended = False

    def _put(self, answer: Answer) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= self.max_pending and isinstance(answer, InferResponse):
            self.overflowed = True
            if not self.ticket.finished:
                self.ticket.cancel()
            log.warning("model '%s': a streamed request was cancelled: its client left %d responses unread",
                        self.model, self.max_pending)
            answer = ResourceExhausted(f"the client read too slowly: {self.max_pending} responses of model "
                                       f"'{self.model}' waited unread, so its request was cancelled")
            self.queue.put_nowait(answer)
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(answer)

    async def get(self) -> Answer:
        """The next answer as it came: a response, the call's error, or None at the end."""
        return await self.queue.get()

    async def next(self) -> InferResponse | None:
        """The next response; None at the end; the call's error raised."""
        if self.ended:
            return None
        answer = await self.queue.get()
        if answer is None or isinstance(answer, InferenceError):
            self.ended = True
            if answer is not None:
                raise answer
        return answer

    def close(self) -> None:
        if not self.ticket.finished:
            self.ticket.cancel()
        self.ended = True
