"""`hostside/receivefiles.py` run in this process: the replaced files' descriptors, held by the
compare-and-swap across the rename and closed by `Release`'s threads, are all closed when it
ends, and the compare-and-swap still refuses a live file that is not the expected one."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import sys

from kerneldev.hostside import receivefiles


def _stream(files: list[dict], bodies: list[bytes], lock: dict | None = None) -> bytes:
    request = json.dumps({"mark": ".kerneldev-tmp-", "files": files, "lock": lock}).encode()
    parts = [struct.pack(">Q", len(request)), request]
    for body in bodies:
        parts += [struct.pack(">cQ", b"D", len(body)), body, struct.pack(">cQ", b"E", 0)]
    return b"".join(parts)


def _run(monkeypatch, data: bytes) -> tuple[bool, list[dict]]:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(receivefiles.signal, "signal", lambda *args: None)  # pytest's SIGINT
    landed = receivefiles.main()
    return landed, [json.loads(line) for line in out.getvalue().splitlines()]


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_replaced_files_are_closed_and_the_swap_still_checked(tmp_path, monkeypatch):
    old, new = b"old\n" * 1000, b"new\n" * 1000
    paths = [tmp_path / f"k_{i:02d}.py" for i in range(40)]
    for path in paths:
        path.write_bytes(old)
    lock = {"path": str(tmp_path / "lock"), "token": "0123456789abcdef"}
    (tmp_path / "lock").write_text(json.dumps({"token": lock["token"]}))
    expect = hashlib.sha256(old).hexdigest()
    files = [{"path": str(p), "mode": None, "expect": expect, "check": True} for p in paths]
    before = _open_fds()
    landed, reports = _run(monkeypatch, _stream(files, [new] * len(paths), lock))
    assert landed and [r["i"] for r in reports if r["ok"]] == list(range(len(paths)))
    assert all(p.read_bytes() == new for p in paths)
    assert _open_fds() <= before  # every replaced file's descriptor closed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [p.name for p in paths] + ["lock"]
    )  # no temporary file

    # The live file is not what was planned: not replaced, and nothing after it.
    paths[1].write_bytes(b"someone else\n")
    files = [
        {"path": str(p), "mode": None, "expect": hashlib.sha256(new).hexdigest(), "check": True}
        for p in paths[:3]
    ]
    landed, reports = _run(monkeypatch, _stream(files, [b"third\n"] * 3, lock))
    assert not landed
    assert [(r["i"], r["ok"], r.get("reason")) for r in reports] == [
        (0, True, None),
        (1, False, "changed"),
    ]
    assert paths[0].read_bytes() == b"third\n" and paths[1].read_bytes() == b"someone else\n"
    assert paths[2].read_bytes() == new
    assert _open_fds() <= before


def test_big_pipe_enlarges_a_pipe_and_ignores_what_is_not_one(tmp_path):
    from kerneldev.hosts.transport import openssh
    from kerneldev.hostside import agent

    r, w = os.pipe()
    try:
        import fcntl

        assert agent._big_pipe(w) is True
        assert fcntl.fcntl(r, 1032) == agent.PIPE_SIZE  # F_GETPIPE_SZ: the same pipe
        r2, w2 = os.pipe()
        openssh.big_pipe(r2)
        assert fcntl.fcntl(w2, 1032) == openssh.PIPE_SIZE
        for fd in (r2, w2):
            os.close(fd)
    finally:
        os.close(r)
        os.close(w)
    with open(tmp_path / "f", "wb") as f:  # not a pipe: left as it is, no error
        assert agent._big_pipe(f.fileno()) is True
        openssh.big_pipe(f.fileno())
