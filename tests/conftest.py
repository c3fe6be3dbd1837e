"""Fixtures every test module may use (sshd, isolated HOME, SGLang releases, per-worker
state) and how a parallel run (pytest-xdist, what `scripts/bootstrap test` runs) hands tests
to its workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import per_run, sglang_releases
from tests.sshd import SSHServer, find_sshd, start_sshd


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture parameter
def pytest_collection_modifyitems(config, items):
    """In a worker of a parallel run (`--dist worksteal`, N workers): the tests marked `slow`
    are dealt out one each to the N equal parts that worksteal first hands the workers (in
    collection order), at the head of each part, so every worker starts on a long test and
    none of them is left to start last; the other tests keep their order (a module's tests
    stay together, which keeps its module-scoped fixtures to few workers). Idle workers then
    steal from the tails. A run in one process keeps the collection order."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if not os.environ.get("PYTEST_XDIST_WORKER") or workers < 2:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    rest = iter([item for item in items if not item.get_closest_marker("slow")])
    parts: list[list] = [slow[k::workers] for k in range(workers)]
    left = len(items)
    for k, part in enumerate(parts):  # worksteal's split: len(pending) // workers left
        size = left // (workers - k)
        left -= size
        part.extend(next(rest) for _ in range(max(0, size - len(part))))
    ordered = [item for part in parts for item in part] + list(rest)
    items[:] = ordered


def _running_sshd(tmp_path_factory, folder: str):
    """Start a real sshd in a fresh folder, yield it, stop it (skip where sshd is missing)."""
    if find_sshd() is None:
        pytest.skip("sshd is not installed (.ci/run installs openssh-server)")
    server = start_sshd(tmp_path_factory.mktemp(folder))
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def private_state_home(tmp_path_factory):
    """kerneldev's local state (the restart record, $XDG_STATE_HOME/kerneldev) in a folder of
    this test process: parallel workers never write one shared file, and the user's own
    ~/.local/state is left alone. A test that unsets it gets its own HOME's instead."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
        # Commands connect one-shot: a kept session per test's host would outlive the test.
        # tests/test_session.py turns them on, and stops what it started.
        # KERNELDEV_TEST_SESSIONS=1 runs every test through kept sessions instead (holders
        # then end with their sshd, their known_hosts file or their idle time).
        if os.environ.get("KERNELDEV_TEST_SESSIONS") != "1":
            patch.setenv("KERNELDEV_NO_KEEP", "1")
        # One-shot commands over paramiko, as every test was written for (many count its
        # channels or cut its sockets); tests/test_one_shot_openssh.py and the transport
        # contract's "openssh" case take the system's ssh. KERNELDEV_TEST_SSH_CLIENT=auto runs
        # every test's one-shot commands the users' default way.
        patch.setenv(
            "KERNELDEV_SSH_CLIENT", os.environ.get("KERNELDEV_TEST_SSH_CLIENT", "paramiko")
        )
        yield


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory) -> SSHServer:
    """One real sshd for the session. Tests that rotate its key must use `fresh_sshd`."""
    yield from _running_sshd(tmp_path_factory, "sshd")


@pytest.fixture
def fresh_sshd(tmp_path_factory) -> SSHServer:
    """A private sshd for tests that change its host key or stop it."""
    yield from _running_sshd(tmp_path_factory, "sshd-own")


@pytest.fixture
def isolated_home(tmp_path, monkeypatch) -> Path:
    """HOME is an empty folder, no ssh-agent, no KERNELDEV_HOST/KERNELDEV_CONFIG, no
    ~/.ssh/config: the user's own set-up plays no part, each test says what is trusted and
    which key is used. The one place tests isolate HOME."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("KERNELDEV_HOST", raising=False)
    monkeypatch.delenv("KERNELDEV_CONFIG", raising=False)
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", "none")
    monkeypatch.delenv("KERNELDEV_TRANSFER", raising=False)  # the timed choice, unless pinned
    return home


@pytest.fixture(scope="session", params=sglang_releases.VERSIONS)
def sglang_release(request, tmp_path_factory) -> sglang_releases.Release:
    """A real SGLang release (each of tests/sglang_releases.VERSIONS), laid out once per test
    run (one for all its workers) as a trimmed live tree; `copy_to` gives a test its own copy.
    Skips, saying why, when the release cache is empty (scripts/bootstrap test fills it) or
    torch is missing."""
    reason = sglang_releases.missing_reason(request.param)
    if reason:
        pytest.skip(reason)
    version = request.param

    def lay_out(folder: Path) -> None:
        sglang_releases.session_release(version, folder)

    folder = per_run.shared_folder(tmp_path_factory, f"sglang-{version}", lay_out)
    return sglang_releases.laid_out_release(version, folder)
