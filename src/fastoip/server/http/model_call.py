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
- Back-pressure: with ``max_pending``, at most that many responses wait unread; one more (the reader, a stream's
  writer blocked on a client that reads nothing, fell that far behind) cancels the call with a log line, and the
  reader gets a 429 error after the responses it had.  A model cannot be paused, so it is stopped.  Without it,
  answers are held until read (generate_stream: the reader's transport bounds what it takes).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from ...core import Core, FinishedCall, on_loop
from ...errors import InferenceError, ResourceExhausted
from ...types import InferRequest, InferResponse

#: A response, the call's error, or None (no more answers).
Answer = InferResponse | InferenceError | None
log = logging.getLogger("fastoip.http")


class ModelCall:
    """A started request whose answers are awaited one by one."""

    def __init__(self, core: Core, request: InferRequest, max_pending: int = 0) -> None:
        self.loop = asyncio.get_running_loop()
        #: Answers not read yet, in order (appended from any thread: deque appends are atomic).
        self.answers: deque[Answer] = deque()
        #: The reader's future while it waits for an answer (set and read on the loop only).
        self.waiter: asyncio.Future[None] | None = None
        #: A wake-up is on its way to the loop and has not started: answers queued now ride with it.
        self.waking = False
        #: Wake-ups sent to the loop so far (fewer than answers when they come in bursts).
        self.wakes = 0
        #: At most this many responses wait unread (0: no bound); past it the call is cancelled (``_overflow``).
        self.max_pending = max_pending
        self.overflowed = False
        self.model = request.model_name
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
        if self.overflowed:
            return
        if self.max_pending and len(self.answers) >= self.max_pending:
            self._overflow()
            return
        self._arrive(response)

    def _overflow(self) -> None:
        """The reader fell ``max_pending`` behind: cancel the call (on the loop) and end with an error."""
        self.overflowed = True
        log.warning("model '%s': a streamed request was cancelled: its client left %d responses unread",
                    self.model, self.max_pending)
        self.loop.call_soon_threadsafe(self._cancel)
        self.answers.append(ResourceExhausted(f"the client read too slowly: {self.max_pending} responses of model "
                                              f"'{self.model}' waited unread, so its request was cancelled"))
        self._arrive(None)

    def _cancel(self) -> None:
        if not self.ticket.finished:
            self.ticket.cancel()

    def _on_done(self, job: FinishedCall) -> None:
        if self.overflowed:
            return
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
