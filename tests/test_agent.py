"""The host agent's protocol over the real sshd: one exec channel, many requests (concurrent,
with stdin and its EOF, signals), and nothing left on the host when the connection goes."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import pytest

from kerneldev.errors import ConnectionLostError
from kerneldev.hosts.transport.agent_client import (
    EXIT,
    HELLO,
    MAGIC,
    OPEN,
    STDIN,
    STDOUT,
    AgentClient,
)
from kerneldev.hosts.transport.over_agent import AgentTransport
from kerneldev.hosts.transport.session import wire
from kerneldev.hosts.transport.session.relay import AgentLink, Client, Relay
from kerneldev.hosts.transport.ssh import agent_channel, start_agent
from kerneldev.hosts.transport.ssh_connection import SSHConnection
from tests.faults import process_gone
from tests.sshutil import kill_sshd_and_sessions, ssh_host


def _agent(server, tmp_path):
    connection = SSHConnection(ssh_host(server, tmp_path))
    client, chan = start_agent(connection, ["python3", sys.executable])
    client.wait_hello(30)
    return connection, client, chan


@pytest.fixture
def agent(sshd_server, tmp_path, isolated_home):
    connection, client, _ = _agent(sshd_server, tmp_path)
    yield client
    client.close()
    connection.close()


def _raw_agent_channel(server, tmp_path):
    """An agent started on its own channel: the connection, the channel and the bytes read
    up to the agent's MAGIC."""
    connection = SSHConnection(ssh_host(server, tmp_path))
    chan = agent_channel(connection, ["python3", sys.executable])
    seen = b""
    while MAGIC not in seen:
        block = chan.recv(4096)
        assert block, "the agent did not start"
        seen += block
    return connection, chan, seen


def test_hello_names_the_agent_and_its_interpreter(agent):
    hello = agent.hello
    assert hello["agent"] == 1 and hello["version"]
    assert os.path.isabs(hello["python"]) and not process_gone(hello["pid"])
    assert agent.ping() < 5


def test_the_agents_source_is_not_in_its_command_line(agent):
    """`ps` on the host shows a short bootstrap; the source came on stdin, then the frames."""
    with open(f"/proc/{agent.hello['pid']}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    command_line = b" ".join(argv)
    assert b"The host agent" not in command_line and b"def serve" not in command_line
    assert len(command_line) < 1000
    assert b"-S" in argv and b"os.read(0" in command_line
    assert agent.run("echo still served") == (0, "still served\n", "")


def test_commands_run_in_sh_with_status_stdout_and_stderr(agent):
    assert agent.run("echo out; echo err >&2; exit 3") == (3, "out\n", "err\n")
    assert agent.run("""x='a "b"'; printf '%s\\n' "$x" | tr a A""") == (0, 'A "b"\n', "")
    status, _, err = agent.run("exec /nonexistent/cmd")
    assert status == 127 and "nonexistent" in err


def test_python_requests_run_the_agents_interpreter_without_site(agent):
    source = "import sys; print(sys.executable, sys.flags.no_site, sys.stdin.read())"
    status, out, _ = agent.run(source, stdin=b"in", python=True)
    assert status == 0 and out.split() == [agent.hello["python"], "1", "in"]


def test_concurrent_requests_keep_their_own_output_and_stdin(agent):
    results: dict[int, tuple] = {}
    payloads = {i: os.urandom(300_000 + i) for i in range(6)}

    def one(i: int) -> None:
        process = agent.open(f"sleep 0.{i}; cat; echo done {i} >&2")
        process.write(payloads[i])
        process.close_stdin()  # EOF: cat ends
        data = b"".join(process.iter_stdout())
        results[i] = (process.wait(10), data, process.stderr_text())

    threads = [threading.Thread(target=one, args=(i,)) for i in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {i: (0, payloads[i], f"done {i}\n") for i in payloads}


def test_signal_ends_the_process_group(agent, tmp_path):
    pids = tmp_path / "pids"
    process = agent.open(f"sleep 60 & echo $! > {pids}; echo $$ >> {pids}; wait")
    while not pids.exists() or len(pids.read_text().split()) < 2:
        time.sleep(0.05)
    process.signal("TERM")
    assert process.wait(10) == 255  # ended by a signal, reported as ssh does
    assert all(process_gone(int(p)) for p in pids.read_text().split())
    assert agent.run("echo still here")[1] == "still here\n"


def test_timeout_ends_the_process_on_the_host(agent, tmp_path):
    pidfile = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        agent.run(f"echo $$ > {pidfile}; exec sleep 60", timeout=3)
    assert process_gone(int(pidfile.read_text()))


def test_stdin_eof_ends_the_agent_and_every_process_it_runs(sshd_server, tmp_path, isolated_home):
    connection, client, chan = _agent(sshd_server, tmp_path)
    pidfile = tmp_path / "pid"
    # A process that ignores TERM: the agent KILLs it 2 s later.
    process = client.open(f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 1; done")
    while not pidfile.exists() or not pidfile.read_text().strip():
        time.sleep(0.05)
    agent_pid = client.hello["pid"]
    client.close()
    assert process_gone(int(pidfile.read_text()))
    assert process_gone(agent_pid)
    assert chan.recv_exit_status() == 0
    with pytest.raises(ConnectionLostError, match="lost"):
        process.wait(10)
    connection.close()


def test_a_killed_connection_is_connection_lost_not_a_traceback(
    fresh_sshd, tmp_path, isolated_home
):
    connection, client, _ = _agent(fresh_sshd, tmp_path)
    process = client.open("sleep 60")
    kill_sshd_and_sessions(fresh_sshd)
    with pytest.raises(ConnectionLostError, match="host agent was lost"):
        process.wait(30)
    with pytest.raises(ConnectionLostError):
        client.run("true")
    connection.close()


def test_closing_a_client_whose_connection_was_cut_raises_nothing():
    """paramiko's `shutdown_write` raises EOFError once the socket under it is gone (a cut
    connection): closing the client then must not raise (a push that was cut reported its
    ConnectionLostError, not this)."""

    def cut() -> None:
        raise EOFError()

    client = AgentClient(lambda n: b"", lambda data: None, shutdown=cut)
    client.close()


def test_a_forked_python_request_holds_no_other_requests_pipes(agent, tmp_path):
    # Python requests run in a fork of the agent, which inherits every descriptor: a kept
    # write end of another request's stdin would keep that request from its EOF.
    release = tmp_path / "release"
    cat = agent.open("cat")
    # The fork runs until the test lets it go, after `cat` has ended: `cat` cannot have waited
    # for it (no wall-clock bound, which a loaded machine could overrun).
    slow = agent.open(
        f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.05)\n"
        "print('slow done')",
        python=True,
    )
    cat.write(b"data")
    cat.close_stdin()
    try:
        assert cat.wait(60) == 0 and not slow.exited
    finally:
        release.touch()
    assert b"".join(cat.iter_stdout()) == b"data"
    assert slow.wait(30) == 0 and b"".join(slow.iter_stdout()) == b"slow done\n"


def test_python_errors_and_exit_codes_read_as_python_c_would(agent):
    for fresh in (False, True):
        status, out, err = agent.run("import sys; print('x'); sys.exit(3)", python=True)
        assert (status, out) == (3, "x\n")
        process = agent.open("raise ValueError('bad')", python=True, fresh=fresh)
        process.close_stdin()
        assert process.wait(30) == 1 and "ValueError: bad" in process.stderr_text()
    status, _, err = agent.run("def (", python=True)
    assert status != 0 and "SyntaxError" in err


# --- one write per request ---------------------------------------------------------------


def test_a_request_its_stdin_and_its_end_go_in_one_write(sshd_server, tmp_path, isolated_home):
    """`AgentClient.batch`: OPEN, STDIN and the EOF as one write (one SSH packet), and a
    transport's hash request the same; the agent answers them as before."""
    connection = SSHConnection(ssh_host(sshd_server, tmp_path))
    chan = agent_channel(connection, ["python3", sys.executable])
    writes: list[bytes] = []

    def write(data: bytes) -> None:
        writes.append(data)
        chan.sendall(data)

    client = AgentClient(chan.recv, write, shutdown=chan.shutdown_write)
    try:
        client.wait_hello(30)
        with client.batch():
            process = client.open("cat")
            process.write(b"piped")
            process.close_stdin()
        assert len(writes) == 1
        assert process.wait(30) == 0 and b"".join(process.iter_stdout()) == b"piped"
        (tmp_path / "root").mkdir()
        (tmp_path / "root" / "a.py").write_text("x = 1\n")
        transport = AgentTransport(client, None, "h")
        writes.clear()
        files, unmatched = transport.hash_files(str(tmp_path / "root"), ["*.py"])
        assert len(writes) == 1 and [f.path for f in files] == ["a.py"] and unmatched == []
    finally:
        client.close()
        connection.close()


def test_the_holders_relay_passes_frames_that_came_together_in_one_write(
    sshd_server, tmp_path, isolated_home
):
    """A client's OPEN, STDIN and EOF written together reach the agent in one write of the
    relay (ids remapped), and the client gets its output and EXIT under its own id."""
    connection, chan, seen = _raw_agent_channel(sshd_server, tmp_path)
    writes: list[bytes] = []

    def write(data: bytes) -> None:
        writes.append(data)
        chan.sendall(data)

    reader = wire.Prefixed(seen.split(MAGIC, 1)[1], chan.recv)
    link = AgentLink(reader.read, write, chan.close, {})
    assert link.read_frame()[0] == HELLO
    relay = Relay(link, refresh=lambda: None, on_failed=lambda err: None)
    ours, theirs = socket.socketpair()
    served = threading.Thread(target=relay.serve, args=(Client(theirs, 0), lambda: None))
    served.start()
    try:
        ours.sendall(
            wire.frame(OPEN, 7, json.dumps({"command": "cat"}).encode())
            + wire.frame(STDIN, 7, b"relayed")
            + wire.frame(STDIN, 7, b"")
        )
        got = []
        while not got or got[-1][0] != EXIT:
            got.append(wire.read_frame(ours.recv))
        assert len(writes) == 1 and writes[0].count(b"relayed") == 1
        assert {rid for _, rid, _ in got} == {7}
        assert b"".join(p for kind, _, p in got if kind == STDOUT) == b"relayed"
    finally:
        ours.close()
        served.join(30)
        link.close()
        connection.close()


def test_a_client_opening_after_the_agent_is_lost_sees_its_connection_lost(
    sshd_server, tmp_path, isolated_home
):
    """The holder's agent connection is gone (its host went away) but the holder has not
    ended yet: a client that opens a request then is cut, as the ones connected at the loss
    were, and reads a lost connection, not an EXIT that looks like the command's failure."""
    connection, chan, seen = _raw_agent_channel(sshd_server, tmp_path)
    reader = wire.Prefixed(seen.split(MAGIC, 1)[1], chan.recv)
    link = AgentLink(reader.read, chan.sendall, chan.close, {})
    assert link.read_frame()[0] == HELLO
    relay = Relay(link, refresh=lambda: None, on_failed=lambda err: None)
    connection.close()  # the SSH connection ends: the relay's agent reader sees EOF
    deadline = time.monotonic() + 30
    while not relay.agent_lost.is_set():
        assert time.monotonic() < deadline, "the relay did not see the agent go"
        time.sleep(0.01)
    ours, theirs = socket.socketpair()
    served = threading.Thread(target=relay.serve, args=(Client(theirs, 0), lambda: None))
    served.start()
    try:
        ours.sendall(wire.frame(OPEN, 3, json.dumps({"command": "true"}).encode()))
        ours.settimeout(30)
        assert wire.read_frame(ours.recv) is None  # EOF: no EXIT frame
        served.join(30)
        assert not served.is_alive() and not relay.clients
    finally:
        ours.close()


# --- pipelines: OPEN "after" ----------------------------------------------------------------


def _status_or_skip(process) -> int | str:
    status = process.wait(30)
    return f"skipped: {process.skip_reason}" if process.skipped else status


def test_a_pipeline_runs_in_order_and_stops_at_the_first_failure(agent, tmp_path):
    """Requests opened `after` another start only once it exited 0, in the order opened; a
    failure skips every later one (never started: no side effect, its stdin dropped)."""
    log = tmp_path / "log"
    assert agent.pipelines
    first = agent.open(f"sleep 0.5; echo first >> {log}")
    second = agent.open(f"cat >> {log}", after=first)
    second.write(b"second\n")  # sent before `first` ended: held on the host until it starts
    second.close_stdin()
    third = agent.open(f"echo third >> {log}; exit 3", after=second)
    fourth = agent.open(f"echo fourth >> {log}", after=third)
    fifth = agent.open(f"cat >> {log}", after=fourth)
    fifth.write(b"fifth\n")
    fifth.close_stdin()
    assert [_status_or_skip(p) for p in (first, second, third)] == [0, 0, 3]
    assert _status_or_skip(fourth) == f"skipped: not started: request {third.rid} did not succeed"
    assert _status_or_skip(fifth).startswith("skipped: ")
    assert log.read_text() == "first\nsecond\nthird\n"
    # After a request that already ended: it starts at once when that one succeeded.
    assert _status_or_skip(agent.open("true", after=first)) == 0
    assert agent.open("true", after=third).wait(30) == 127
    # An id never opened (or another client's, through a holder) is refused, never run.
    stray = tmp_path / "stray"
    unknown = agent.open(f"touch {stray}", after=type(first)(agent, 999_999, "none"))
    assert unknown.wait(30) == 127 and unknown.skipped and not stray.exists()


def test_cancel_stops_a_waiting_request_and_leaves_a_running_one(agent, tmp_path):
    gate = tmp_path / "gate"
    running = agent.open(f"while [ ! -e {gate} ]; do sleep 0.05; done; echo ran")
    waiting = agent.open(f"touch {tmp_path / 'waiting-ran'}", after=running)
    later = agent.open(f"touch {tmp_path / 'later-ran'}", after=waiting)
    waiting.signal("CANCEL")
    running.signal("CANCEL")  # ignored: it runs
    assert waiting.wait(30) == 127 and waiting.skip_reason == "not started: cancelled"
    gate.touch()
    assert running.wait(30) == 0 and b"".join(running.iter_stdout()) == b"ran\n"
    assert later.wait(30) == 127 and later.skipped
    assert not (tmp_path / "waiting-ran").exists() and not (tmp_path / "later-ran").exists()


def test_the_connections_end_starts_nothing_that_waits(sshd_server, tmp_path, isolated_home):
    """The stream ends while a pipeline's first step runs, and that step still ends well (it
    ignores TERM and exits 0 within the agent's grace): the next never starts (nothing of a
    deploy runs after its client is gone)."""
    connection, client, _ = _agent(sshd_server, tmp_path)
    pidfile = tmp_path / "pid"
    first = client.open(f"trap '' TERM; echo $$ > {pidfile}; sleep 1; exit 0")
    client.open(f"touch {tmp_path / 'after-ran'}", after=first)
    while not pidfile.exists() or not pidfile.read_text().strip():
        time.sleep(0.05)
    agent_pid = client.hello["pid"]
    client.close()
    assert process_gone(int(pidfile.read_text())) and process_gone(agent_pid)
    assert not (tmp_path / "after-ran").exists()
    connection.close()


def test_the_relay_chains_a_clients_own_requests_and_never_anothers(
    sshd_server, tmp_path, isolated_home
):
    """Through a holder's relay: "after" names the client's own id, turned into the agent's;
    an id the client did not open (another client's request) is refused by the agent."""
    connection, chan, seen = _raw_agent_channel(sshd_server, tmp_path)
    reader = wire.Prefixed(seen.split(MAGIC, 1)[1], chan.recv)
    link = AgentLink(reader.read, chan.sendall, chan.close, {})
    assert link.read_frame()[0] == HELLO
    relay = Relay(link, refresh=lambda: None, on_failed=lambda err: None)
    socks, threads = [], []
    for pid in (1, 2):
        ours, theirs = socket.socketpair()
        socks.append(ours)
        threads.append(
            threading.Thread(target=relay.serve, args=(Client(theirs, pid), lambda: None))
        )
        threads[-1].start()
    a, b = socks

    def open_(sock, cid, command, after=None):
        spec = {"command": command} | ({"after": after} if after is not None else {})
        sock.sendall(wire.frame(OPEN, cid, json.dumps(spec).encode()) + wire.frame(STDIN, cid, b""))

    def exits(sock, n):
        got = {}
        while len(got) < n:
            kind, cid, payload = wire.read_frame(sock.recv)
            if kind == EXIT:
                got[cid] = json.loads(payload)
        return got

    try:
        open_(a, 5, "sleep 0.3")
        open_(a, 6, f"touch {tmp_path / 'a-ran'}", after=5)
        open_(b, 5, f"touch {tmp_path / 'b-ran'}", after=1)  # b opened no request 1
        assert exits(b, 1)[5].get("skipped")
        assert exits(a, 2) == {5: {"status": 0}, 6: {"status": 0}}
        assert (tmp_path / "a-ran").exists() and not (tmp_path / "b-ran").exists()
    finally:
        for sock in socks:
            sock.close()
        for thread in threads:
            thread.join(30)
        link.close()
        connection.close()


def test_a_failed_write_to_the_client_starts_nothing_that_waits(tmp_path):
    """The client is gone when the agent's first write to it fails (the stdin's EOF may come
    later): a request waiting `after` the one that just ended is not started (in-process: the
    agent's frames go to a pipe whose reading end is closed)."""
    from kerneldev.hostside import agent as host_agent

    inp_r, inp_w = os.pipe()
    out_r, out_w = os.pipe()
    agent = host_agent.Agent(inp_r, host_agent.Output(out_w))
    serving = threading.Thread(target=agent.serve, daemon=True)
    serving.start()

    def frame(kind, rid, value):
        payload = json.dumps(value).encode()
        os.write(inp_w, host_agent.HEADER.pack(len(payload), rid, kind) + payload)

    hello = os.read(out_r, 1 << 16)
    assert hello  # HELLO came; from now on nothing reads the agent's frames
    os.close(out_r)
    frame(host_agent.OPEN, 1, {"command": "sleep 0.3"})
    frame(host_agent.OPEN, 2, {"command": f"touch {tmp_path / 'after-ran'}", "after": 1})
    deadline = time.monotonic() + 10
    while not agent.out.broken and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a started follower would have run by now
    os.close(inp_w)
    serving.join(10)
    agent.end_all()
    os.close(inp_r)
    os.close(out_w)
    assert agent.out.broken
    assert not (tmp_path / "after-ran").exists()
