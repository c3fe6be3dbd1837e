"""`kerneldev diff --patch` on what is not a small text file (kerneldev/loop/drift.py): binary files
are summarised with sizes and hashes, never printed; large files are not diffed; long patches
are cut."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import yaml

from kerneldev.config import HostConfig
from kerneldev.errors import TransferError
from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.loop import drift
from tests.localhost import local_host


def _host(tmp_path: Path, files: tuple[str, ...]) -> HostConfig:
    return local_host(tmp_path / "live", tmp_path / "ws", files)


def test_binary_files_differ_with_sizes_and_hashes_through_the_cli(tmp_path, isolated_home):
    live, ws = tmp_path / "live", tmp_path / "ws"
    old = b"\x00\x1b[2J\xff\xfe" * 100  # NUL, a terminal escape, not UTF-8
    new = old + b"\x00more"
    live.mkdir()
    (live / "lib.so").write_bytes(old)
    config = tmp_path / "hosts.yaml"
    entry = {"transport": "local", "root": str(live), "files": ["lib.so"], "workspace": "ws"}
    config.write_text(yaml.safe_dump({"hosts": {"h": entry}}))

    def kerneldev(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "kerneldev", "--config", str(config), *args],
            capture_output=True,
            timeout=60,
        )

    assert kerneldev("pull").returncode == 0
    (ws / "lib.so").write_bytes(new)
    proc = kerneldev("diff", "--patch")
    assert proc.returncode == 1
    out = proc.stdout.decode()
    assert "Binary files live/lib.so and workspace/lib.so differ" in out
    assert f"live/lib.so: {len(old)} bytes, sha256 {hashlib.sha256(old).hexdigest()}" in out
    assert f"workspace/lib.so: {len(new)} bytes, sha256 {hashlib.sha256(new).hexdigest()}" in out
    assert b"\x00" not in proc.stdout and b"\x1b[2J" not in proc.stdout


class NoReads(LocalTransport):
    def read_bytes(self, path: str) -> bytes:
        raise TransferError("a file over the patch limit must not be read")


def test_a_large_file_is_summarised_without_reading_it(tmp_path, monkeypatch):
    monkeypatch.setattr(drift, "PATCH_MAX_BYTES", 1000)
    host = _host(tmp_path, ("big.txt",))
    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "big.txt").write_text("line\n" * 400)  # 2000 bytes
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "big.txt").write_text("other\n" * 10)
    report = drift.compute_drift(NoReads(host), host, patch=True)
    patch = report.files[0].patch
    assert patch.startswith("Files live/big.txt and workspace/big.txt differ (larger than")
    assert "live/big.txt: 2000 bytes" in patch and "workspace/big.txt: 60 bytes" in patch


def test_a_long_patch_is_cut_with_a_count():
    old = "".join(f"{i}\n" for i in range(100)).encode()
    new = "".join(f"{i}!\n" for i in range(100)).encode()
    patch = drift.unified_diff(old, new, "a", "b", max_lines=20)
    lines = patch.splitlines()
    assert len(lines) == 21 and lines[-1].startswith("... 183 more line(s)")


def test_text_with_a_terminal_escape_counts_as_binary():
    assert drift.is_binary(b"print('\x1b[31mred')\n")
    assert not drift.is_binary("tabs\tand ünïcode\r\n".encode())
