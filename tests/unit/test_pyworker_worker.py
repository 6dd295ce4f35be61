"""The worker's channel to the server: typed records; a turn sent as one ``Many`` is read one at a time, in order."""

from __future__ import annotations

import socket

from fastoip.pyworker import channel as msg
from fastoip.pyworker.framing import FramedSocket
from fastoip.pyworker.worker import _Channel


def test_a_many_is_read_in_order_and_its_answers_reach_their_waiters() -> None:
    server_end, worker_end = socket.socketpair()
    server = FramedSocket(server_end)
    channel = _Channel(FramedSocket(worker_end))
    try:
        call_id, answers = channel.call(msg.ReadyQuery, "other", "1")  # a BLS call waiting for its answer
        assert msg.decode(server.recv_bytes(), msg.TO_SERVER) == msg.ReadyQuery(call_id, "other", "1")
        turn = [msg.Execute(1, []), msg.Reply(call_id, True, None), msg.Execute(2, [])]
        server.send_bytes(msg.encode(msg.Many(turn)))
        server.send_bytes(msg.encode(msg.Execute(3, [])))  # a single message after it
        assert channel.next_message() == msg.Execute(1, [])
        assert channel.next_message() == msg.Execute(2, [])  # the reply between them went to its waiter
        assert answers.get_nowait() == msg.Reply(call_id, True, None)
        assert channel.next_message() == msg.Execute(3, [])
        assert not channel._unread
    finally:
        server_end.close()
        worker_end.close()
