"""A pytest plugin (pyproject's `-p tests.leftovers`): no test leaves a kept session's holder
or a warm process running.

Both are detached processes that outlive the command that started them (a holder idles out
after 300 s, a warm process likewise), so a test that forgets to stop them leaves them behind
on the machine. Every process a test starts inherits `KERNELDEV_TEST_RUN` (set once per run)
and pytest's `PYTEST_CURRENT_TEST`, so they are found in /proc by what started them:

- after each test (unless KERNELDEV_TEST_SESSIONS=1, where holders end with their sshd by
  design), a holder or warm process it started that is still there after a short wait is
  stopped and the test fails in its teardown, naming it;
- at the end of the run, whatever is left from any test is stopped and listed in the summary.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

RUN_ENV = "KERNELDEV_TEST_RUN"
KINDS = {
    b"kerneldev.hosts.transport.session.holder": "session holder",
    b"kerneldev.cli.warm": "warm process",
}
EXIT_WAIT = 10.0  # seconds a stopped holder may take to exit (it lets running requests end)


def pytest_configure(config) -> None:
    # xdist workers inherit the controller's value: one run, one marker.
    os.environ.setdefault(RUN_ENV, uuid.uuid4().hex)


def leftovers(test: str | None = None) -> list[tuple[int, str, str]]:
    """(pid, kind, the test that started it) of this run's holders and warm processes; only
    those started by the test `test` (a node id) when given, on this xdist worker."""
    run = f"{RUN_ENV}={os.environ.get(RUN_ENV)}".encode()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            kind = next((KINDS[a] for a in argv if a in KINDS), None)
            if kind is None:
                continue
            environ = dict(
                v.split(b"=", 1) for v in (proc / "environ").read_bytes().split(b"\0") if b"=" in v
            )
        except OSError:
            continue  # gone, or not ours to read
        if b"=".join((RUN_ENV.encode(), environ.get(RUN_ENV.encode(), b""))) != run:
            continue
        started_by = environ.get(b"PYTEST_CURRENT_TEST", b"?").decode(errors="replace")
        started_by = started_by.rsplit(" (", 1)[0]  # "tests/x.py::test_y (call)"
        if test is not None:
            if started_by != test or environ.get(b"PYTEST_XDIST_WORKER", b"") != worker:
                continue
        found.append((int(proc.name), kind, started_by))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop(found: list[tuple[int, str, str]]) -> None:
    for pid, _, _ in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def end_test_processes(test: str, timeout: float = EXIT_WAIT) -> None:
    """For a test's own teardown: stop the holders and warm processes the test `test` started
    that are still there (a warm process still starting up has no socket to be asked on yet)
    and wait until they are gone. Looked for again until none is left: a warm process's
    starter forks the real one and exits (cli/warm.py), so the child of a starter that was
    stopped a moment too late shows up only in a later look (seen under load)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [f for f in leftovers(test) if _alive(f[0])]
        if not found or time.monotonic() >= deadline:
            return
        stop(found)
        while any(_alive(pid) for pid, _, _ in found) and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_holder_left(request):
    """Fails the test (in its teardown, after its own fixtures) when a holder or warm process it
    started is still running."""
    yield
    if os.environ.get("KERNELDEV_TEST_SESSIONS") == "1":
        return
    found = leftovers(request.node.nodeid)
    deadline = time.monotonic() + EXIT_WAIT
    while found and time.monotonic() < deadline:  # stopped ones may still be on their way out
        time.sleep(0.1)
        found = [f for f in leftovers(request.node.nodeid) if _alive(f[0])]
    if found:
        stop(found)
        _stopped_by_tests.update(pid for pid, _, _ in found)
        names = ", ".join(f"{kind} pid {pid}" for pid, kind, _ in found)
        pytest.fail(f"the test left running: {names} (stopped now); stop them in its teardown")


_stopped_by_tests: set[int] = set()  # failed their test already
_stopped_at_end: list[tuple[int, str, str]] = []


def pytest_sessionfinish(session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller looks once every worker is done
    found = [f for f in leftovers() if _alive(f[0]) and f[0] not in _stopped_by_tests]
    stop(found)
    _stopped_at_end.extend(found)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _stopped_at_end:
        return
    terminalreporter.section("kerneldev processes left by tests (stopped)")
    for pid, kind, test in _stopped_at_end:
        terminalreporter.line(f"{kind} pid {pid}, started by {test}")
