"""One model call's answers on the event loop, in order: each response, then the end or the error.

The call runs through ``Core.start`` with a response sink, so a decoupled model's responses arrive as they are
produced and the loop never waits on a model; ``close()`` cancels a call still running (a client that went
away, a stop string met), which stops a decoupled model's generation.  Used by generate / generate_stream and by
the OpenAI routes (one wrapper for both).
"""

from __future__ import annotations

import asyncio

from ...core import Core, FinishedCall, on_loop
from ...errors import InferenceError
from ...types import InferRequest, InferResponse

#: A response, the call's error, or None (no more answers).
Answer = InferResponse | InferenceError | None


class ModelCall:
    """A started request whose answers are awaited one by one."""

    def __init__(self, core: Core, request: InferRequest) -> None:
        self.queue: asyncio.Queue[Answer] = asyncio.Queue()
        hop = on_loop(asyncio.get_running_loop(), self.queue.put_nowait)

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
