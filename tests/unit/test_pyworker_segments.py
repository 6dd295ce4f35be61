"""The tensor segments between the server and its Python workers (issue 36): names no client can guess or forge,
pages reserved before use, a bounded pool that empties when idle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from fastoip.pyworker import transport

LARGE = transport.INLINE_LIMIT // 4 * 2  # FP32 elements: over the inline limit, into a segment


def _segment_files(token: str = transport.TOKEN) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"{transport.SEGMENT_PREFIX}{token}-")]


def test_a_segment_is_named_with_the_process_secret_token() -> None:
    packed = transport.pack(np.ones(LARGE, dtype=np.float32))
    try:
        kind, name = packed[0], packed[1]
        assert kind in ("p", "s")
        assert name.startswith(f"fastoip-pyw-{transport.TOKEN}-")  # not the pid: 128 random bits
        assert len(transport.TOKEN) == 32 and transport.TOKEN != transport.new_token()
        assert not name.startswith(f"fastoip-pyw-{os.getpid()}-")  # (what it was: guessed in seconds)
        assert os.stat(os.path.join("/dev/shm", name)).st_mode & 0o777 == 0o600
        np.testing.assert_array_equal(transport.unpack(packed, transport.TOKEN), np.ones(LARGE, dtype=np.float32))
    finally:
        transport.discard(packed)


def test_a_name_of_another_token_is_refused() -> None:
    """The server checks a worker's names against that worker's token: another process's segment is refused."""
    packed = transport.pack(np.ones(LARGE, dtype=np.float32))
    try:
        with pytest.raises(ValueError, match="not a tensor segment of this worker"):
            transport.unpack(packed, transport.new_token())
    finally:
        transport.discard(packed)


@pytest.mark.parametrize("kind", ["s", "p"])
@pytest.mark.parametrize(
    "forged",
    [
        "../../{victim}",
        "fastoip-pyw-{token}-../../{victim}",
        "fastoip-pyw-{token}-1/../../{victim}",
        "fastoip-pyw-{token}-",
        "fastoip-pyw-{token}-１２",  # fullwidth digits: str.isdigit says yes, the pattern says no
        "/{victim}",
    ],
)
def test_a_forged_name_neither_reads_nor_unlinks_a_file(tmp_path: Path, forged: str, kind: str) -> None:
    """Issue 36 item 5: a worker's ``../../<file>`` made the server read a file and unlink it."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"\1" * (transport.HEADER + 64))
    relative = os.path.relpath(victim, "/dev/shm")
    name = forged.format(token=transport.TOKEN, victim=relative)
    for token in (transport.TOKEN, None):  # the server's check (a worker's token) and the worker's (any segment)
        with pytest.raises(ValueError, match="not a tensor segment"):
            transport.unpack((kind, name, "<f4", (16,)), token)
    assert victim.exists() and victim.read_bytes()[:1] == b"\1"


def test_a_segment_of_the_right_name_but_not_a_regular_file_is_refused() -> None:
    name = f"{transport.SEGMENT_PREFIX}{transport.TOKEN}-99999999"
    path = os.path.join("/dev/shm", name)
    os.symlink("/etc/hostname", path)
    try:
        with pytest.raises(OSError):  # O_NOFOLLOW: ELOOP
            transport.unpack(("p", name, "<f4", (1,)), transport.TOKEN)
    finally:
        os.unlink(path)


def test_the_pool_is_bounded_and_a_tensor_over_it_goes_one_shot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "_pool_limit", 4 * (transport.HEADER + (1 << 16)))
    held = []
    try:
        for _ in range(8):  # none released: the pool fills, then every tensor is a one-shot file
            held.append(transport.pack(np.ones(LARGE, dtype=np.float32)))
        kinds = [packed[0] for packed in held]
        assert kinds.count("p") <= 4 and "s" in kinds
        assert transport._pool_bytes <= transport.pool_limit()
        big = transport.pack(np.ones(1 << 20, dtype=np.float32))  # 4 MiB: larger than the whole pool
        held.append(big)
        assert big[0] == "s"
    finally:
        for packed in held:
            transport.discard(packed)


def test_idle_pooled_segments_are_removed_and_the_receiver_lets_go() -> None:
    """Issue 36: an idle server kept 720 MB of /dev/shm after 8 requests of 48 MB; now idle segments go."""
    array = np.arange(LARGE, dtype=np.float32)
    packed = [transport.pack(array) for _ in range(3)]
    assert all(p[0] == "p" for p in packed)
    views = [transport.unpack(p, transport.TOKEN) for p in packed]  # this process maps them as a receiver too
    names = {p[1] for p in packed}
    assert names <= set(_segment_files())
    del views  # the receiver's views go: the segments are free
    deadline = time.monotonic() + 10 * transport.IDLE_S
    while time.monotonic() < deadline and (names & set(_segment_files()) or names & set(transport._mapped)):
        time.sleep(0.1)
    assert not names & set(_segment_files())  # the files are gone ...
    assert not names & set(transport._mapped)  # ... and the receiver's mappings with them


def test_segments_of_a_dead_worker_are_removed_by_its_token() -> None:
    token = transport.new_token()
    path = os.path.join("/dev/shm", f"{transport.SEGMENT_PREFIX}{token}-7")
    Path(path).write_bytes(b"\0" * 128)
    transport.remove_files_of("../*")  # not a token: nothing happens
    assert os.path.exists(path)
    transport.remove_files_of(token)
    assert not os.path.exists(path)


FULL_SHM = """
    import os, sys
    import numpy as np
    from fastoip.pyworker import transport

    # 512 KiB fits the 1 MiB /dev/shm; the second tensor (2 MiB) does not
    tensors = [("A", "FP32", np.ones(1 << 17, dtype=np.float32)), ("B", "FP32", np.ones(1 << 19, dtype=np.float32))]
    try:
        transport.pack_tensors(tensors)
    except transport.SharedMemoryFull as exc:
        print("FULL", exc)
    print("LEFT", sorted(os.listdir("/dev/shm")))
    # a tensor that fits still goes through afterwards
    packed = transport.pack(np.ones(1 << 17, dtype=np.float32))
    print("AFTER", packed[0], float(transport.unpack(packed, transport.TOKEN).sum()))
"""


def test_a_full_dev_shm_is_an_error_not_a_sigbus(tmp_path: Path) -> None:
    """A 1 MiB /dev/shm (a private mount namespace): a tensor that does not fit fails with SharedMemoryFull, what
    was packed before it is given back, and the process lives (it died of SIGBUS when the file was only
    ftruncated and then written)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private /dev/shm")
    script = tmp_path / "full.py"
    script.write_text(textwrap.dedent(FULL_SHM))
    command = f'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "{sys.executable}" "{script}"'
    done = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FASTOIP_PYTHON_SHM_POOL": "0"})
    if done.returncode != 0 and "mount" in done.stderr and "FULL" not in done.stdout:
        pytest.skip(f"no private mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "no room in /dev/shm for a tensor of 2097152 bytes" in done.stdout
    assert "LEFT []" in done.stdout  # the first tensor's segment was given back
    assert "AFTER s 131072.0" in done.stdout


def test_a_peer_cannot_have_more_pooled_segments_mapped_than_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that invents pooled names (real files of its own) is stopped at its share of mappings: the SIGBUS
    guard's table, which clients' registrations use too, is never filled by one worker."""
    monkeypatch.setattr(transport, "PEER_MAPPINGS_LIMIT", 3)
    token = transport.new_token()
    names = [f"{transport.SEGMENT_PREFIX}{token}-{n}" for n in range(4)]
    views = []
    try:
        for name in names:
            Path("/dev/shm", name).write_bytes(b"\0" * (transport.HEADER + 64))
        for name in names[:3]:
            views.append(transport.unpack(("p", name, "<f4", (16,)), token))
        with pytest.raises(ValueError, match="3 pooled segments mapped here, the most it may"):
            transport.unpack(("p", names[3], "<f4", (16,)), token)
    finally:
        del views
        transport.remove_files_of(token)


def test_a_forked_child_has_its_own_token_and_leaves_the_parents_segments() -> None:
    """A child forked from the server (a pool of processes) must not reuse, name or remove the parent's segments."""
    packed = transport.pack(np.ones(LARGE, dtype=np.float32))
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report its token and whether its pool is empty, then exit running atexit
            os.close(read)
            child = transport.pack(np.ones(LARGE, dtype=np.float32))
            message = f"{transport.TOKEN} {len(transport._pool)} {child[1]}"
            transport.discard(child)
            os.write(write, message.encode())
            os.close(write)
            transport._remove_own_segments()  # what atexit runs: the child's segments only
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            token, pooled, name = pipe.read().split()
        os.waitpid(pid, 0)
        assert token != transport.TOKEN and name.startswith(f"{transport.SEGMENT_PREFIX}{token}-")
        assert pooled == "1"  # its own new segment, none of the parent's
        assert packed[1] in _segment_files()  # the parent's segment is still there
        assert not _segment_files(token)
    finally:
        transport.discard(packed)
