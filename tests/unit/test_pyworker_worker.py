"""The worker's channel to the server: a turn of messages sent as one ``many`` is read one at a time, in order."""

from __future__ import annotations

import pickle
import socket

from fastoip.pyworker.framing import FramedSocket
from fastoip.pyworker.worker import _Channel


def test_a_many_is_read_in_order_and_its_answers_reach_their_waiters() -> None:
    server_end, worker_end = socket.socketpair()
    server = FramedSocket(server_end)
    channel = _Channel(FramedSocket(worker_end))
    try:
        call_id, answers = channel.call_with_id("model_ready", "other", "1")  # a BLS call waiting for its answer
        assert pickle.loads(server.recv_bytes()) == ("call", call_id, "model_ready", ("other", "1"))
        turn = [("execute", 1, []), ("reply", call_id, True), ("execute", 2, [])]
        server.send_bytes(pickle.dumps(("many", turn)))
        server.send_bytes(pickle.dumps(("execute", 3, [])))  # a single message after it
        assert channel.next_message() == ("execute", 1, [])
        assert channel.next_message() == ("execute", 2, [])  # the reply between them went to its waiter
        assert answers.get_nowait() == (True, True)
        assert channel.next_message() == ("execute", 3, [])
        assert not channel._unread
    finally:
        server_end.close()
        worker_end.close()
