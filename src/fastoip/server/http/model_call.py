"""One model call's answers on the event loop, in order: each response, then the end or the error.

The call runs through ``Core.start`` with a response sink, so a decoupled model's responses arrive as they are
produced and the loop never waits on a model; ``close()`` cancels a call still running (a client that went
away, a stop string met), which stops a decoupled model's generation.  Used by generate / generate_stream and by
the OpenAI routes (one wrapper for both).

Rules (the per-token path of every streamed answer):
- Answers are queued as they come, from whichever thread produced them; the loop is woken once per burst,
  not once per answer: an answer that finds a wake-up already on its way rides with it (one hop for all the
  tokens a model produced while the loop was busy).
- ``get`` / ``next`` return at once, without a pass of the loop, while answers are queued; ``ready()`` says
  so, which lets a writer gather every queued answer into one write.
- Answers are held until read (as before: the reader's transport bounds what it takes, not this queue).
"""

from __future__ import annotations

import asyncio
from collections import deque

from ...core import Core, FinishedCall, on_loop
from ...errors import InferenceError
from ...types import InferRequest, InferResponse

#: A response, the call's error, or None (no more answers).
Answer = InferResponse | InferenceError | None


class ModelCall:
    """A started request whose answers are awaited one by one."""

    def __init__(self, core: Core, request: InferRequest) -> None:
        self.loop = asyncio.get_running_loop()
        #: Answers not read yet, in order (appended from any thread: deque appends are atomic).
        self.answers: deque[Answer] = deque()
        #: The reader's future while it waits for an answer (set and read on the loop only).
        self.waiter: asyncio.Future[None] | None = None
        #: A wake-up is on its way to the loop and has not started: answers queued now ride with it.
        self.waking = False
        #: Wake-ups sent to the loop so far (fewer than answers when they come in bursts).
        self.wakes = 0
        self.hop = on_loop(self.loop, self._wake)
        self.ticket = core.start(request, None, self._on_done, self._on_response)
        self.ended = False

    def _arrive(self, answer: Answer) -> None:
        """On the producing thread: queue ``answer``, and wake the loop unless a wake-up is on its way."""
        self.answers.append(answer)
        if not self.waking:  # (a wake-up past this check has cleared the flag first: it sees this answer)
            self.waking = True
            self.wakes += 1
            self.hop()

    def _on_response(self, job: FinishedCall, response: InferResponse) -> None:
        self._arrive(response)

    def _on_done(self, job: FinishedCall) -> None:
        if job.error is not None:
            self.answers.append(job.error)
        elif job.response is not None:
            self.answers.append(job.response)
        self._arrive(None)

    def _wake(self) -> None:
        """On the loop: the reader, if it waits, reads what is queued."""
        self.waking = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def ready(self) -> bool:
        """An answer is queued: the next ``get`` / ``next`` returns it without waiting."""
        return bool(self.answers)

    async def get(self) -> Answer:
        """The next answer as it came: a response, the call's error, or None at the end."""
        answers = self.answers
        while not answers:
            waiter = self.waiter = self.loop.create_future()
            try:
                await waiter
            finally:
                self.waiter = None
        return answers.popleft()

    async def next(self) -> InferResponse | None:
        """The next response; None at the end; the call's error raised."""
        if self.ended:
            return None
        answer = await self.get()
        if answer is None or isinstance(answer, InferenceError):
            self.ended = True
            if answer is not None:
                raise answer
        return answer

    def close(self) -> None:
        if not self.ticket.finished:
            self.ticket.cancel()
        self.ended = True
