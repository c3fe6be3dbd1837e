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
import time

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


# --- the backups made in the upload's process (issue 23 round 7) ----------------------------


def _run_raw(monkeypatch, data: bytes) -> tuple[bool, list[str], list[dict]]:
    """`main()` in this process: (landed, the non-JSON lines (the backups'), the reports)."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(receivefiles.signal, "signal", lambda *args: None)  # pytest's SIGINT
    landed = receivefiles.main()
    lines = out.getvalue().splitlines()
    reports = [json.loads(line) for line in lines if line.startswith("{")]
    return landed, [line for line in lines if not line.startswith("{")], reports


def _backup_stream(tmp_path, n, expect_ok=True, lock=None):
    """n live files (old bytes) to replace by new ones, with their backups in `bk/`."""
    old, new = b"old\n" * 500, b"new\n" * 500
    paths = [tmp_path / f"k_{i}.py" for i in range(n)]
    for i, path in enumerate(paths):
        path.write_bytes(old)
        os.chmod(path, 0o640)
        os.utime(path, ns=(1_600_000_000_123_456_789 + i, 1_500_000_000_987_654_321 + i))
    sha_old = hashlib.sha256(old).hexdigest()
    bk = tmp_path / "bk"
    items = [[str(p), str(bk / f".{p.name}.tmp"), str(bk / p.name)] for p in paths]
    expect = [sha_old if expect_ok else "0" * 64] * n
    files = [{"path": str(p), "mode": None, "expect": sha_old, "check": True} for p in paths]
    request = {"mark": ".kerneldev-tmp-", "files": files, "lock": lock}
    request["backups"] = {"items": items, "expect": expect, "lock": lock}
    data = json.dumps(request).encode()
    parts = [struct.pack(">Q", len(data)), data]
    for _ in paths:
        parts += [struct.pack(">cQ", b"D", len(new)), new, struct.pack(">cQ", b"E", 0)]
    return paths, bk, old, new, b"".join(parts)


def test_backups_in_the_upload_are_exact_and_made_before_any_rename(tmp_path, monkeypatch):
    """With `backups`, every backup is made (bytes, mode, times as the live file's) and checked
    before the first live file is renamed, while the files' bytes land meanwhile: the backups
    wait here until every temporary file is written, which would never happen if the upload
    waited for the backups before writing."""
    from kerneldev.hostside import hostcommon

    paths, bk, old, new, data = _backup_stream(tmp_path, 5)
    stats = {p.name: os.stat(p) for p in paths}
    written = []
    real_write, real_copy, real_rename = receivefiles.write_temp, hostcommon.copy_all, os.rename
    renames = []

    def write_temp(*args, **kwargs):
        result = real_write(*args, **kwargs)
        written.append(result[1])
        return result

    def copy_all(*args, **kwargs):
        deadline = time.monotonic() + 10
        while len(written) < len(paths) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(written) == len(paths), "the upload waited for the backups to write"
        return real_copy(*args, **kwargs)

    def rename(src, dst):
        renames.append(str(dst))
        return real_rename(src, dst)

    monkeypatch.setattr(receivefiles, "write_temp", write_temp)
    monkeypatch.setattr(receivefiles, "copy_all", copy_all)
    monkeypatch.setattr(os, "rename", rename)
    landed, lines, reports = _run_raw(monkeypatch, data)
    assert landed and [r["i"] for r in reports if r["ok"]] == list(range(5))
    sha_old = hashlib.sha256(old).hexdigest()
    assert lines == [f"{i} {sha_old}" for i in range(5)] + ["backups ok"]
    live = [str(p) for p in paths]
    assert renames[:5] == [str(bk / p.name) for p in paths] and renames[5:] == live
    for p in paths:
        assert p.read_bytes() == new
        backup, was = os.stat(bk / p.name), stats[p.name]
        assert (bk / p.name).read_bytes() == old
        assert (backup.st_mode, backup.st_uid, backup.st_gid) == (
            was.st_mode,
            was.st_uid,
            was.st_gid,
        )
        assert (backup.st_atime_ns, backup.st_mtime_ns) == (was.st_atime_ns, was.st_mtime_ns)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bk"] + sorted(p.name for p in paths)


def test_a_backup_not_as_planned_renames_nothing(tmp_path, monkeypatch, capsys):
    """A backup whose sum is not the planned one (the live file changed since the plan): no
    file is renamed, every temporary file is removed, the first file is reported `backup`,
    and stderr says what `copyfiles.py` says (`copyfiles: mismatch 0`)."""
    paths, bk, old, new, data = _backup_stream(tmp_path, 4, expect_ok=False)
    landed, lines, reports = _run_raw(monkeypatch, data)
    assert not landed
    assert [(r["i"], r["ok"], r.get("reason")) for r in reports] == [(0, False, "backup")]
    assert "copyfiles: mismatch 0" in capsys.readouterr().err
    assert "backups ok" not in lines
    assert all(p.read_bytes() == old for p in paths)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bk"] + sorted(p.name for p in paths)


def test_a_lock_lost_between_files_stops_before_the_next_rename(tmp_path, monkeypatch):
    """The lock is read once a file, right before its rename: taken over once the first file
    is renamed, the second is not renamed (reported `lock`), nor anything after, and no
    temporary file is left."""
    lock = {"path": str(tmp_path / "lock"), "token": "0123456789abcdef"}
    (tmp_path / "lock").write_text(json.dumps({"token": lock["token"]}))
    paths = [tmp_path / f"k_{i}.py" for i in range(3)]
    for path in paths:
        path.write_bytes(b"old\n")
    files = [{"path": str(p), "mode": None, "expect": None, "check": False} for p in paths]
    real_rename = os.rename

    def rename(src, dst):
        real_rename(src, dst)
        (tmp_path / "lock").write_text(json.dumps({"token": "fedcba9876543210"}))

    monkeypatch.setattr(os, "rename", rename)
    landed, reports = _run(monkeypatch, _stream(files, [b"new\n"] * 3, lock))
    assert not landed
    assert [(r["i"], r["ok"], r.get("reason")) for r in reports] == [
        (0, True, None),
        (1, False, "lock"),
    ]
    assert [p.read_bytes() for p in paths] == [b"new\n", b"old\n", b"old\n"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k_0.py", "k_1.py", "k_2.py", "lock"]


def test_copyfiles_as_the_host_runs_it_keeps_owner_mode_and_times(tmp_path):
    """`hostscripts.script(copyfiles)` (`hostcommon.py`'s source ahead of it) run as the host
    does, `python3 -S -c`: each backup has the live file's bytes, owner, mode (set-group-ID
    bit too) and times to the nanosecond, set on its descriptor."""
    import subprocess

    from kerneldev.hosts.transport.hostscripts import script
    from kerneldev.hostside import copyfiles

    src = tmp_path / "live.py"
    src.write_bytes(b"x" * 70_000)
    os.chmod(src, 0o2750)
    os.utime(src, ns=(1_600_000_000_123_456_789, 1_500_000_000_987_654_321))
    if os.geteuid() == 0:
        os.chown(src, 12345, 23456)
    was = os.stat(src)
    dst = tmp_path / "bk" / "live.py"
    request = {"items": [[str(src), str(tmp_path / "bk" / ".live.tmp"), str(dst)]]}
    run = subprocess.run(
        [sys.executable, "-S", "-c", script(copyfiles)],
        input=json.dumps(request).encode(),
        capture_output=True,
        check=True,
    )
    assert run.stdout.decode() == f"0 {hashlib.sha256(b'x' * 70_000).hexdigest()}\n"
    now = os.stat(dst)
    assert dst.read_bytes() == src.read_bytes()
    assert (now.st_mode, now.st_uid, now.st_gid) == (was.st_mode, was.st_uid, was.st_gid)
    assert (now.st_atime_ns, now.st_mtime_ns) == (was.st_atime_ns, was.st_mtime_ns)
