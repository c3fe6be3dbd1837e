"""Host groups: three real loopback sshd instances stand in for a fleet (node0, node1, node2),
sharing one workspace, driven through the CLI as a user would (`python -m kerneldev`)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import (
    ExitCode,
    HostConnectionError,
    RefusedError,
    StateError,
    UsageError,
)
from kerneldev.hosts import fleet
from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.loop import drift, sync
from kerneldev.loop.state import load_state
from tests.clirun import run_kerneldev, start_kerneldev
from tests.sshd import find_sshd, free_port, start_sshd
from tests.sshutil import ssh_entry

NODES = ("node0", "node1", "node2")
FILES = ("k/a.py", "k/b.py")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    if find_sshd() is None:
        pytest.skip("sshd is not installed (.ci/run installs openssh-server)")
    started = [start_sshd(tmp_path_factory.mktemp(f"sshd-{n}")) for n in NODES]
    yield dict(zip(NODES, started, strict=True))
    for s in started:
        s.stop()


class Fleet:
    """Three hosts on three sshds, each with its own live tree, one shared workspace."""

    def __init__(
        self, tmp: Path, servers, unhealthy: str | None = None, never_healthy: bool = False
    ) -> None:
        self.tmp = tmp
        self.workspace = tmp / "ws"
        self.roots = {n: tmp / f"live-{n}" for n in NODES}
        self.old: dict[str, bytes] = {}
        for root in self.roots.values():
            for path in FILES:
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                data = f"# {path} v1\nx = 1\n".encode()
                (root / path).write_bytes(data)
                self.old[path] = data
        hosts = {}
        for name, server in servers.items():
            (tmp / name).mkdir()
            entry = ssh_entry(server, tmp / name)
            root = self.roots[name]
            # The host named `unhealthy` is healthy only while a.py has its old bytes: the
            # new kernel "crashes its server".
            health = f"grep -q v1 '{root / 'k/a.py'}'" if name == unhealthy else "true"
            entry.update(
                root=str(root),
                files=["k/*.py"],
                workspace=str(self.workspace),
                service={
                    "restart": f"echo restart >> '{tmp / ('restarts-' + name)}'",
                    "health": "false" if never_healthy else health,
                    # The unhealthy host waits it out: 5 s, long enough for its health command
                    # over SSH on a busy 2-core CI machine. A healthy one passes its first check
                    # and never waits, so a generous 60 s costs nothing and no load can fail it.
                    "timeout": 5 if name == unhealthy and not never_healthy else 60,
                    "logs": f"echo {name} log: kernel crashed",
                },
            )
            hosts[name] = entry
        # A host nobody listens for: a port just freed.
        down = ssh_entry(servers["node0"], tmp / "node0")
        down.update(port=free_port(), root="/nonexistent", files=["k/*.py"])
        down["workspace"] = str(tmp / "ws-down")
        hosts["down"] = down
        self.config = tmp / "hosts.yaml"
        self.config.write_text(
            json.dumps({"groups": {"fleet": list(NODES)}, "default": "node0", "hosts": hosts})
        )

    def env(self) -> dict[str, str]:
        return {"KERNELDEV_CONFIG": str(self.config), "KERNELDEV_HOST": ""}

    def kd(self, *args: str):
        return run_kerneldev(*args, env=self.env(), timeout=120)

    def live(self, name: str, path: str) -> bytes:
        return (self.roots[name] / path).read_bytes()

    def restarts(self, name: str) -> int:
        marker = self.tmp / f"restarts-{name}"
        return marker.read_text().count("restart") if marker.exists() else 0


def _entries(run) -> dict[str, dict]:
    data = json.loads(run.stdout)
    return {e["host"]: e for e in data["hosts"]}


def test_group_push_rolls_back_a_host_whose_restart_command_fails(tmp_path, servers):
    """A restart command that exits 3 (on node1, while the new kernel is live) counts as an
    unhealthy service: that host is rolled back and restarted again, the next wave skipped."""
    f = Fleet(tmp_path, servers)
    config = json.loads(f.config.read_text())
    node1 = config["hosts"]["node1"]["service"]
    node1["restart"] += f"; grep -q v1 '{f.roots['node1'] / 'k/a.py'}' || exit 3"
    f.config.write_text(json.dumps(config))
    assert f.kd("pull", "--host", "fleet").returncode == 0
    new = b"# k/a.py v2: the new kernel\nx = 2\n"
    (f.workspace / "k/a.py").write_bytes(new)
    run = f.kd("push", "--restart", "--serial", "1", "--host", "fleet", "--json")
    assert run.returncode == int(ExitCode.FAILURE), run.stderr
    entries = _entries(run)
    assert [entries[n]["status"] for n in NODES] == ["ok", "failed", "skipped"]
    failed = entries["node1"]
    assert "exited 3" in failed["error"]["message"] and "rolled back" in failed["error"]["message"]
    assert failed["result"]["auto_rollback"]["rolls_back"] == failed["result"]["deploy_id"]
    assert failed["result"]["health"]["last_check"] == "restart exited 3"
    assert (f.live("node0", "k/a.py"), f.live("node1", "k/a.py")) == (new, f.old["k/a.py"])
    assert (f.restarts("node0"), f.restarts("node1"), f.restarts("node2")) == (1, 2, 0)


def test_group_push_restart_stops_at_the_unhealthy_wave_and_rolls_that_host_back(tmp_path, servers):
    f = Fleet(tmp_path, servers, unhealthy="node1")
    pull = f.kd("pull", "--host", "fleet", "--json")
    assert pull.returncode == 0, pull.stderr
    assert [e["status"] for e in json.loads(pull.stdout)["hosts"]] == ["ok", "ok", "ok"]

    new = b"# k/a.py v2: the new kernel\nx = 2\n"
    (f.workspace / "k/a.py").write_bytes(new)
    run = f.kd("push", "--restart", "--serial", "1", "--host", "fleet", "--json")
    assert run.returncode == int(ExitCode.FAILURE), run.stderr
    entries = _entries(run)
    assert list(entries) == list(NODES)  # one entry per host, in the group's order
    assert [entries[n]["status"] for n in NODES] == ["ok", "failed", "skipped"]
    assert entries["node0"]["result"]["health"]["healthy"] is True
    failed = entries["node1"]
    assert failed["error"]["type"] == "UnhealthyError"
    assert "rolled back" in failed["error"]["message"]
    assert failed["result"]["auto_rollback"]["rolls_back"] == failed["result"]["deploy_id"]
    assert "not started: wave 2 failed on node1" in entries["node2"]["error"]["message"]
    assert json.loads(run.stdout)["error"]["code"] == 1

    # Byte for byte: the healthy wave keeps the new file, the unhealthy host has its old bytes
    # back, the wave after it was never touched.
    assert f.live("node0", "k/a.py") == new
    assert f.live("node1", "k/a.py") == f.old["k/a.py"]
    assert f.live("node2", "k/a.py") == f.old["k/a.py"]
    for name in NODES:
        assert f.live(name, "k/b.py") == f.old["k/b.py"]
    assert (f.restarts("node0"), f.restarts("node1"), f.restarts("node2")) == (1, 2, 0)
    assert "kernel crashed" in run.stderr  # the failing host's service logs

    # One shared workspace, one record per host: node0's deploy, node1's deploy and its
    # automatic rollback; node2 deployed nothing. Nobody's record overwrote another's.
    records = {n: load_state(f.workspace, n) for n in NODES}
    assert [d.kind for d in records["node0"].deploys] == ["push"]
    assert [(d.kind, d.outcome) for d in records["node1"].deploys] == [
        ("push", "deployed"),
        ("rollback", "auto-rollback"),
    ]
    assert records["node2"].deploys == []
    assert records["node0"].files["k/a.py"].sha256 != records["node1"].files["k/a.py"].sha256
    raw = json.loads((f.workspace / ".kerneldev/state.json").read_text())
    assert raw["version"] == 3 and raw["host"] == "node0"
    assert sorted(raw["hosts"]) == ["node1", "node2"]

    # The group's diff afterwards: node0 alone has the new bytes.
    again = f.kd("diff", "--host", "fleet")
    assert again.returncode == 1
    line = next(x for x in again.stdout.splitlines() if x.startswith("k/a.py"))
    assert line.split()[1:] == ["in-sync", "edited", "edited", "differs:", "node0"]


def test_diff_across_hosts_flags_the_host_whose_file_differs(tmp_path, servers):
    f = Fleet(tmp_path, servers)
    assert f.kd("pull", "--host", "fleet").returncode == 0
    in_sync = f.kd("diff", "--host", "fleet", "--json")
    assert in_sync.returncode == 0, in_sync.stderr
    assert all(e["status"] == "ok" for e in _entries(in_sync).values())

    (f.roots["node2"] / "k/b.py").write_bytes(b"# hand edit on node2\n")
    run = f.kd("diff", "--host", "fleet", "--json")
    assert run.returncode == 1
    data = json.loads(run.stdout)
    across = {e["path"]: e["differs_on"] for e in data["across_hosts"]}
    assert across == {"k/a.py": [], "k/b.py": ["node2"]}
    entries = _entries(run)
    assert [entries[n]["status"] for n in NODES] == ["ok", "ok", "failed"]
    statuses = {f["path"]: f["status"] for f in entries["node2"]["result"]["files"]}
    assert statuses == {"k/a.py": "in-sync", "k/b.py": "drifted"}

    text = f.kd("diff", "--host", "node0,node1,node2")
    assert text.returncode == 1
    line = next(x for x in text.stdout.splitlines() if x.startswith("k/b.py"))
    assert line.split()[1:] == ["in-sync", "in-sync", "drifted", "differs:", "node2"]
    summary = next(x for x in text.stdout.splitlines() if x.startswith("node2 "))
    assert "live differs from the other hosts: k/b.py" in summary

    # --patch: the patches in stdout say whose they are (saved to a file, stderr is gone).
    patched = f.kd("diff", "--host", "fleet", "--patch").stdout.splitlines()
    assert "node2:" in patched and "node0:" not in patched and "node1:" not in patched
    after = patched[patched.index("node2:") + 1 :]
    assert after[0].startswith("--- ") and "k/b.py" in after[0]
    assert "+# hand edit on node2" not in after  # live -> workspace: the edit is removed
    assert "-# hand edit on node2" in after

    # pull from the group compares the others with the reference (--from node1).
    pull = f.kd("pull", "--host", "fleet", "--from", "node1", "--json")
    assert pull.returncode == 1
    entries = _entries(pull)
    assert list(entries) == ["node1", "node0", "node2"]
    assert entries["node2"]["result"]["files"] == {"k/a.py": "same", "k/b.py": "differs"}
    assert entries["node0"]["status"] == "ok"


def test_group_diff_names_the_mirror_when_only_the_mirror_differs(tmp_path, servers):
    f = Fleet(tmp_path, servers)
    mirror = tmp_path / "mirror-node1"
    (mirror / "k").mkdir(parents=True)
    (mirror / "k/a.py").write_bytes(b"# upstream a.py\n")
    (mirror / "k/b.py").write_bytes(f.old["k/b.py"])
    config = json.loads(f.config.read_text())
    config["hosts"]["node1"]["mirror"] = str(mirror)
    f.config.write_text(json.dumps(config))
    assert f.kd("pull", "--host", "fleet").returncode == 0
    run = f.kd("diff", "--host", "fleet", "--json")
    assert run.returncode == 1
    node1 = _entries(run)["node1"]
    assert [x["status"] for x in node1["result"]["files"]] == ["in-sync", "in-sync"]
    assert node1["status"] == "failed"
    assert node1["error"]["message"] == "live differs from the mirror: k/a.py"
    assert _entries(run)["node0"]["status"] == "ok"


def test_one_unreachable_host_does_not_hide_the_others(tmp_path, servers):
    f = Fleet(tmp_path, servers)
    assert f.kd("pull").returncode == 0  # node0 alone (the default): single-host output
    run = f.kd("diff", "--host", "node0,down", "--json")
    assert run.returncode == int(ExitCode.UNREACHABLE), run.stderr
    entries = _entries(run)
    assert entries["node0"]["status"] == "ok" and entries["node0"]["exit_code"] == 0
    assert [x["status"] for x in entries["node0"]["result"]["files"]] == ["in-sync", "in-sync"]
    assert entries["down"]["status"] == "unreachable" and entries["down"]["exit_code"] == 3
    assert entries["down"]["error"]["type"] == "HostConnectionError"

    text = f.kd("diff", "--host", "node0,down")
    assert text.returncode == 3
    summary = {ln.split()[0]: ln.split()[1:3] for ln in text.stdout.splitlines()[-2:]}
    assert summary == {"node0": ["ok", "0"], "down": ["unreachable", "3"]}
    assert "down:" in text.stderr and "Traceback" not in text.stderr


def test_group_pull_from_an_unreachable_reference_names_the_way_out(tmp_path, servers):
    f = Fleet(tmp_path, servers)
    run = f.kd("pull", "--host", "down,node1", "--json")
    assert run.returncode == 3
    entries = _entries(run)
    assert entries["down"]["status"] == "unreachable"
    assert entries["node1"]["status"] == "skipped"
    assert "`--from node1` pulls from another host" in entries["node1"]["error"]["message"]


def test_push_serial_without_restart_is_a_usage_error(tmp_path, servers):
    f = Fleet(tmp_path, servers)
    run = f.kd("push", "--serial", "2", "--host", "fleet", "--json")
    assert run.returncode == 2
    assert "--serial needs --restart" in json.loads(run.stdout)["error"]["message"]
    assert not (tmp_path / "ws").exists()  # nothing ran


def test_a_stale_lock_taken_over_in_a_group_is_a_warning(tmp_path, servers):
    import socket
    import subprocess

    f = Fleet(tmp_path, servers)
    assert f.kd("pull", "--host", "fleet").returncode == 0
    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = {"user": "bob", "machine": socket.gethostname(), "pid": dead.pid}
    holder.update(command="push", since="2026-11-30T06:00:00Z", token="deadbeef")
    (f.roots["node1"] / ".kerneldev").mkdir(exist_ok=True)
    (f.roots["node1"] / ".kerneldev/lock").write_text(json.dumps(holder))
    (f.workspace / "k/a.py").write_bytes(b"# k/a.py v2\n")
    run = f.kd("push", "--host", "fleet")  # no restart: no health timing under load
    assert run.returncode == 0, run.stderr
    assert "kerneldev: warning: node1: took over a stale lock: bob@" in run.stderr
    assert "node0: took over" not in run.stderr


def test_ctrl_c_after_every_host_pulled_is_not_an_interruption(tmp_path, servers, monkeypatch):
    """Ctrl-C once every host's pull has ended: the group pull exits 0 (not 130) and says the
    signal came after the end, as a one-host pull and a group push do."""
    import io

    from kerneldev.cli.environment import Environment
    from kerneldev.cli.main import main
    from kerneldev.loop import fleet_ops

    f = Fleet(tmp_path, servers)
    for key, value in f.env().items():
        monkeypatch.setenv(key, value)
    real = fleet_ops.pull_group

    def pull_then_ctrl_c(*args, **kwargs):
        outcomes = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it
        while interrupt.pending() is None:  # the handler runs in the main thread
            time.sleep(0.01)
        return outcomes

    monkeypatch.setattr(fleet_ops, "pull_group", pull_then_ctrl_c)
    out, err = io.StringIO(), io.StringIO()
    args = ["pull", "--host", "node0,node1", "--json"]
    code = main(args, env=Environment(stdout=out, stderr=err, stdin=io.StringIO()))
    assert code == 0, err.getvalue()
    assert "Ctrl-C came after every host's pull had ended" in err.getvalue()
    assert [e["status"] for e in json.loads(out.getvalue())["hosts"]] == ["ok", "ok"]


def test_ctrl_c_after_every_host_pushed_is_not_an_interruption(tmp_path, servers, monkeypatch):
    """Ctrl-C while the last host writes its record (shielded): every host is deployed and
    recorded, so the group push exits 0 and says the signal came after the end."""
    import io

    from kerneldev.cli.environment import Environment
    from kerneldev.cli.main import main
    from kerneldev.hosts.transport import agent_chain
    from kerneldev.loop import history

    f = Fleet(tmp_path, servers)
    for key, value in f.env().items():
        monkeypatch.setenv(key, value)
    assert f.kd("pull", "--host", "node0,node1").returncode == 0
    (f.workspace / "k/a.py").write_bytes(b"# k/a.py v2\n")
    append = history.append_record

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it
        while interrupt.pending() is None:  # the handler runs in the main thread
            time.sleep(0.01)

    def ctrl_c_on_the_last_host(transport, root, *args, **kwargs):
        if root == str(f.roots["node1"]):
            ctrl_c()
        return append(transport, root, *args, **kwargs)

    # Through the host agent the record is the last request of the push's chain: the signal
    # comes while its answer is awaited (shielded, as the append above).
    record_step = agent_chain.RunStep.result

    def ctrl_c_on_the_last_hosts_record(step):
        if str(f.roots["node1"]) in step.doing:
            ctrl_c()
        return record_step(step)

    monkeypatch.setattr(history, "append_record", ctrl_c_on_the_last_host)
    monkeypatch.setattr(agent_chain.RunStep, "result", ctrl_c_on_the_last_hosts_record)
    out, err = io.StringIO(), io.StringIO()
    args = ["push", "--host", "node0,node1", "--parallel", "1", "--no-import-check", "--json"]
    code = main(args, env=Environment(stdout=out, stderr=err, stdin=io.StringIO()))
    assert code == 0, err.getvalue()
    assert "Ctrl-C came after every host's push had ended" in err.getvalue()
    assert [e["status"] for e in json.loads(out.getvalue())["hosts"]] == ["ok", "ok"]
    for name in ("node0", "node1"):
        assert f.live(name, "k/a.py") == b"# k/a.py v2\n"


def test_ctrl_c_on_a_group_leaves_every_host_in_a_defined_state(tmp_path, servers):
    f = Fleet(tmp_path, servers, never_healthy=True)
    assert f.kd("pull", "--host", "fleet").returncode == 0
    new = b"# k/a.py v2\n"
    (f.workspace / "k/a.py").write_bytes(new)
    proc = start_kerneldev("push", "--restart", "--serial", "3", "--host", "fleet", env=f.env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(f.restarts(n) for n in NODES):
        time.sleep(0.05)
    assert all(f.restarts(n) for n in NODES), "the restarts never began"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C while every host waits for health
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    # Every host: pushed, its restart stopped; the summary says so per host.
    assert "where each host stands" in err
    for name in NODES:
        assert f.live(name, "k/a.py") == new
        assert next(ln for ln in out.splitlines() if ln.startswith(name)).split()[1:3] == [
            "interrupted",
            "130",
        ]
        assert any(
            ln.startswith(f"  {name}:") and "Deployed: k/a.py" in ln for ln in err.splitlines()
        )
    assert err.count("Deployed: k/a.py") == 3  # said once per host, not again as its error
    assert not list(tmp_path.glob("live-*/.kerneldev/lock"))  # every lock released


def test_dry_run_push_restart_and_rollback_on_a_group(tmp_path, servers):
    f = Fleet(tmp_path, servers)
    assert f.kd("pull", "--host", "fleet").returncode == 0
    new = b"# k/b.py v2\n"
    (f.workspace / "k/b.py").write_bytes(new)
    plan = f.kd("push", "--dry-run", "--host", "node0,node2", "--json")
    assert plan.returncode == 0, plan.stderr
    assert [e["result"]["dry_run"] for e in _entries(plan).values()] == [True, True]
    assert all(f.live(n, "k/b.py") == f.old["k/b.py"] for n in NODES)

    push = f.kd("push", "--host", "fleet")
    assert push.returncode == 0, push.stderr
    assert all(f.live(n, "k/b.py") == new for n in NODES)
    restart = f.kd("restart", "--host", "fleet", "--serial", "2", "--json")
    assert restart.returncode == 0, restart.stderr
    assert all(e["result"]["healthy"] for e in _entries(restart).values())
    assert [f.restarts(n) for n in NODES] == [1, 1, 1]

    back = f.kd("rollback", "--host", "fleet")
    assert back.returncode == 0, back.stderr
    assert all(f.live(n, "k/b.py") == f.old["k/b.py"] for n in NODES)
    assert "rolled back" in back.stdout
    bad = f.kd("bench", "--host", "fleet", "--variants", "nonsense")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_single_host_and_bad_group_usage(tmp_path, servers):
    f = Fleet(tmp_path, servers)
    one = f.kd("pull", "--host", "node1", "--json")
    assert one.returncode == 0
    assert set(json.loads(one.stdout)) == {"host", "workspace", "files", "missing"}
    bad = f.kd("pull", "--host", "fleet", "--from", "elsewhere")
    assert bad.returncode == 2 and "--from elsewhere" in bad.stderr
    nope = f.kd("diff", "--host", "node0,nobody")
    assert nope.returncode == 2 and "nobody" in nope.stderr


# --- the runner itself -------------------------------------------------------------------------


def _hosts(tmp_path: Path, n: int) -> list[HostConfig]:
    return [
        HostConfig(f"h{i}", str(tmp_path), ("*.py",), tmp_path / "ws", transport="local")
        for i in range(n)
    ]


def test_worst_exit_order_and_per_host_errors(tmp_path):
    errors = {"h1": RefusedError("refused"), "h2": HostConnectionError("down"), "h3": None}

    def fn(host, transport, progress):
        progress(f"working on {host.name}")
        err = errors.get(host.name)
        if err is not None:
            raise err
        return host.name

    events = []
    out = fleet.run_on_hosts(_hosts(tmp_path, 4), fn, parallel=2, on_event=events.append)
    assert [(o.host, o.status, o.exit_code) for o in out] == [
        ("h0", "ok", 0),
        ("h1", "failed", 1),
        ("h2", "unreachable", 3),
        ("h3", "ok", 0),
    ]
    assert out[0].result == "h0" and out[1].message == "refused"
    assert fleet.worst_exit(out) == 3
    for name in ("h0", "h1", "h2", "h3"):  # per host: started, progress, done, in that order
        assert [e.kind for e in events if e.host == name] == ["started", "progress", "done"]
    usage = fleet.failed_outcome("x", UsageError("bad"))
    assert fleet.worst_exit([*out, usage]) == 2
    stopped = fleet.failed_outcome("y", interrupt.Interrupted(signal.SIGINT))
    assert fleet.worst_exit([*out, usage, stopped]) == 130


def test_interrupt_leaves_unstarted_hosts_not_started(tmp_path, monkeypatch):
    started = []

    def fn(host, transport, progress):
        started.append(host.name)
        monkeypatch.setattr(interrupt, "_pending", signal.SIGINT)  # Ctrl-C while h0 works
        interrupt.check()

    out = fleet.run_in_waves(_hosts(tmp_path, 3), fn, serial=1)
    assert started == ["h0"]
    assert [(o.status, o.exit_code) for o in out] == [("interrupted", 130)] * 3
    assert "not started" in out[1].message and "not started" in out[2].message
    assert fleet.worst_exit(out) == 130


def test_state_version_2_is_read_and_each_host_keeps_its_own_record(tmp_path):
    from kerneldev.loop.state import state_path, update_state

    ws = tmp_path / "ws"
    state_path(ws).parent.mkdir(parents=True)
    base = {"path": "k/a.py", "sha256": "aa", "size": 1, "mode": 420}
    v2 = {
        "version": 2,
        "host": "node0",
        "root": "/r",
        "files": {"k/a.py": {**base, "synced_at": "t", "synced_by": "pull"}},
        "deploys": [],
    }
    state_path(ws).write_text(json.dumps(v2))
    assert load_state(ws).files["k/a.py"].sha256 == "aa"  # no host named: the first one's
    assert load_state(ws, "node1").files == {} and load_state(ws, "node1").others == ["node0"]

    def set_base(sha):
        def change(state):
            state.root = "/r"
            state.set_base("k/a.py", sha, 1, 420, "push")

        return change

    update_state(ws, set_base("bb"), "node1")
    update_state(ws, set_base("cc"), "node2")
    update_state(ws, set_base("dd"), "node1")
    raw = json.loads(state_path(ws).read_text())
    assert raw["version"] == 3 and raw["host"] == "node0"
    assert raw["files"]["k/a.py"]["sha256"] == "aa"  # node0's record untouched
    assert {n: r["files"]["k/a.py"]["sha256"] for n, r in raw["hosts"].items()} == {
        "node1": "dd",
        "node2": "cc",
    }
    assert load_state(ws, "node2").files["k/a.py"].sha256 == "cc"


def test_a_group_renamed_over_a_shared_workspace_is_told_which_records_to_rename(tmp_path):
    live, ws = tmp_path / "live", tmp_path / "ws"
    (live / "k").mkdir(parents=True)
    (live / "k/a.py").write_text("x = 1\n")
    old = HostConfig("node0", str(live), ("k/*.py",), ws, transport="local")
    sync.pull(LocalTransport(old), old)
    renamed = dataclasses.replace(old, name="gpu0", workspace_peers=("gpu1",))
    with pytest.raises(StateError) as caught:
        drift.compute_drift(LocalTransport(renamed), renamed)
    hint = caught.value.hint
    assert "'gpu0' shares this workspace with gpu1 (a group)" in hint
    assert "records of node0, not in that group" in hint
    assert "the keys of 'hosts'" in hint
