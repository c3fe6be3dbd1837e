"""Bad input everywhere (issue 9): random and mutated hosts.yaml, odd files, a host that
refuses writes or runs out of space, a file that disappears mid-push, remote commands that
must end with an interrupted command."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kerneldev import interrupt
from kerneldev.config import load_config
from kerneldev.errors import ConfigError, KerneldevError
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.loop import lock as host_lock
from kerneldev.loop import sync
from kerneldev.loop.state import load_state
from tests.faults import interrupt_once_written, meddled, process_gone, temp_files
from tests.localhost import local_host
from tests.sshutil import ssh_host

VALID = """\
default: dsv4
hosts:
  dsv4:
    hostname: gpu-box
    user: me
    port: 22
    root: /srv/sglang
    files:
      - python/sglang/srt/layers/attention/*.py
    workspace: ws
    keep_backups: 5
    service:
      restart: systemctl restart sglang
      health: http://127.0.0.1:30000/health
      timeout: 600
      logs: journalctl -u sglang -n 50
"""

yaml_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_config(path).host(None)
    except ConfigError:
        pass  # a clean error (exit 2) is the expected outcome; anything else fails the test


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=yaml_values)
def test_config_loader_random_documents(tmp_path, doc):
    _load(tmp_path, yaml.safe_dump(doc))


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_config_loader_mutations_of_a_valid_file(tmp_path, data):
    lines = VALID.splitlines()
    kind = data.draw(st.sampled_from(["delete", "replace", "insert", "truncate", "bytes"]))
    i = data.draw(st.integers(0, len(lines) - 1))
    if kind == "delete":
        del lines[i]
    elif kind == "replace":
        key = lines[i].split(":")[0]
        lines[i] = (
            f"{key}: {yaml.safe_dump(data.draw(yaml_values), default_flow_style=True).strip()}"
        )
    elif kind == "insert":
        lines.insert(i, data.draw(st.text(max_size=20)))
    elif kind == "truncate":
        lines = lines[:i] + [lines[i][: data.draw(st.integers(0, len(lines[i])))]]
    text = "\n".join(lines) + "\n"
    if kind == "bytes":
        j = data.draw(st.integers(0, len(text) - 1))
        text = text[:j] + data.draw(st.text(min_size=1, max_size=3)) + text[j + 1 :]
    _load(tmp_path, text)


def test_config_errors_exit_2_without_traceback(tmp_path):
    from tests.sshutil import run_cli

    for text in ("hosts: [1, 2", "hosts:\n  h:\n    root: rel\n", "\x00\x01", "- - -\n"):
        path = tmp_path / "hosts.yaml"
        path.write_text(text)
        proc = run_cli("diff", config=path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("log", "--limit", "-1"),  # used to list everything, as if it were 0 ("all")
        ("push", "--lock-wait", "-1"),
        ("restart", "--lock-wait", "-1"),
        ("watch", "--lock-wait", "-1"),
        ("status", "--timeout", "inf"),  # used to overflow the socket timeout: a traceback
        ("doctor", "--timeout", "1e400"),
    ],
)
def test_a_negative_count_or_wait_is_a_usage_error(tmp_path, args):
    from tests.sshutil import run_cli

    proc = run_cli(*args, config=tmp_path / "none.yaml")
    assert proc.returncode == 2 and args[1] in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# --- files ---------------------------------------------------------------------------------


@pytest.fixture
def ssh_env(sshd_server, tmp_path, isolated_home):
    host = ssh_host(sshd_server, tmp_path, files=("k/*",))
    (Path(host.root) / "k").mkdir(parents=True, exist_ok=True)
    return host


def _push(host, **kw):
    with open_transport(host) as t, host_lock.HostLock(t, host.root, "push", wait=5):
        return sync.push(t, host, **kw)


def test_empty_non_utf8_and_500_files(ssh_env):
    host = ssh_env
    root, ws = Path(host.root), Path(host.workspace)
    (root / "k/empty").write_bytes(b"")
    (root / "k/latin1").write_bytes(b"caf\xe9\n")
    for i in range(500):
        (root / f"k/f{i:03d}").write_bytes(f"{i}\n".encode())
    with open_transport(host) as t:
        sync.pull(t, host)
    (ws / "k/empty").write_bytes(b"\xff\xfe not utf-8 \x80")
    (ws / "k/latin1").write_bytes(b"")
    for i in range(500):
        (ws / f"k/f{i:03d}").write_bytes(f"{i} edited\n".encode())
    result = _push(host)
    assert len(result.deployed) == 502
    assert (root / "k/empty").read_bytes() == b"\xff\xfe not utf-8 \x80"
    assert (root / "k/latin1").read_bytes() == b""
    assert (root / "k/f499").read_bytes() == b"499 edited\n"
    assert not temp_files(root)


def test_file_disappearing_mid_push_is_refused_not_recreated(ssh_env):
    host = ssh_env
    root, ws = Path(host.root), Path(host.workspace)
    for name in ("a", "b"):
        (root / f"k/{name}").write_bytes(b"v1\n")
    with open_transport(host) as t:
        sync.pull(t, host)
    for name in ("a", "b"):
        (ws / f"k/{name}").write_bytes(b"v2\n")

    # Someone deletes b on the host once a has landed.
    vanishing = meddled(host, "k/a", (root / "k/b").unlink)
    with vanishing as t, pytest.raises(sync.PartialDeployError) as caught:
        sync.push(t, host)
    assert "k/b changed on the host" in caught.value.message
    assert not (root / "k/b").exists() and not temp_files(root)


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs root and mount(8)")
def test_read_only_host_and_disk_full(tmp_path):
    """A read-only folder (bind mount, remounted ro: root ignores chmod) and a full disk (a
    1 MB tmpfs): a clear error, live files untouched, no temporary file left."""
    root = tmp_path / "live"
    (root / "k").mkdir(parents=True)
    (root / "k/a.py").write_bytes(b"v1\n")
    host = local_host(root, tmp_path / "ws")
    t = LocalTransport(host)
    sync.pull(t, host)
    (host.workspace / "k/a.py").write_bytes(b"v2\n" * 1000)
    (root / ".kerneldev").mkdir()
    k = str(root / "k")
    if not (_mount("--bind", k, k) and _mount("-o", "remount,ro,bind", k)):
        subprocess.run(["umount", k], capture_output=True)
        pytest.skip("cannot make a read-only bind mount here")
    try:
        with pytest.raises(KerneldevError) as caught:
            with host_lock.HostLock(t, host.root, "push", wait=1):
                sync.push(t, host)
        assert "Read-only" in caught.value.message or "cannot" in caught.value.message
        assert (root / "k/a.py").read_bytes() == b"v1\n"
    finally:
        subprocess.run(["umount", k], capture_output=True)
    assert not temp_files(root)

    if not _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", k):
        pytest.skip("cannot mount a tmpfs here")
    try:
        (root / "k/a.py").write_bytes(b"v1\n")
        (host.workspace / "k/a.py").write_bytes(os.urandom(256 * 1024))
        with pytest.raises(KerneldevError) as caught:
            with host_lock.HostLock(t, host.root, "push", wait=1):
                sync.push(t, host)
        assert "No space left" in caught.value.message, caught.value.message
        assert (root / "k/a.py").read_bytes() == b"v1\n"
        assert not temp_files(root)
        assert load_state(host.workspace).deploys == []
    finally:
        subprocess.run(["umount", k], capture_output=True)


# --- remote commands end with the command ------------------------------------------------------


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_interrupt_ends_the_remote_command(kind, sshd_server, tmp_path, isolated_home):
    host = ssh_host(sshd_server, tmp_path, transport=kind)
    pidfile = tmp_path / "pid"
    with open_transport(host) as t:
        with pytest.raises(interrupt.Interrupted) as caught, interrupt.deferred_signals():
            with interrupt_once_written(pidfile):
                # what a bench harness looks like: a child that runs on and on
                t.run(f"sh -c 'echo $$ > {pidfile}; exec sleep 60' & wait")
        assert caught.value.exit_code == 130
    pid = int(pidfile.read_text())
    assert process_gone(pid), f"process {pid} still runs on the host"


def test_a_host_symlink_out_of_root_is_never_written_through(ssh_env, tmp_path):
    # The scan sees only regular files inside root: a link out of it looks absent, and the
    # "new" file's upload used to write through it (with --force, over a file outside root).
    host = ssh_env
    root, ws = Path(host.root), Path(host.workspace)
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.py").write_bytes(b"not yours\n")
    (root / "k/link.py").symlink_to(outside / "secret.py")
    (root / "k/dir").symlink_to(outside / "sub")
    (root / "k/ok.py").write_bytes(b"v1\n")
    with open_transport(host) as t:
        sync.pull(t, host)
    (ws / "k/link.py").write_bytes(b"mine\n")
    (ws / "k/dir").mkdir()
    (ws / "k/dir/new.py").write_bytes(b"mine\n")
    host = replace(host, files=("k/*", "k/dir/*"))
    with open_transport(host) as t:
        plan = sync.push(t, host, dry_run=True)
    refused = {f.path: f.reason for f in plan.files if f.action == "refused"}
    assert refused == {"k/link.py": sync.OUT_OF_ROOT, "k/dir/new.py": sync.OUT_OF_ROOT}
    for force in (False, True):
        with pytest.raises(sync.RefusedError) as caught:
            _push(host, force=force)
        assert "never writes outside root" in caught.value.message
        assert "k/link.py" in caught.value.message and "k/dir/new.py" in caught.value.message
    assert (outside / "secret.py").read_bytes() == b"not yours\n"
    assert list((outside / "sub").iterdir()) == []
    assert (root / "k/link.py").is_symlink() and not temp_files(root)


def test_a_host_symlink_out_of_root_shows_where_the_file_set_names_it(ssh_env, tmp_path):
    """docs/usage.md: a glob matches only regular files inside root, so a link out of root that
    nothing else names is not listed; a literal entry, a synced file or a workspace file that
    is such a link on the host is `missing-live` (and push refuses to create it)."""
    from kerneldev.loop import drift

    host = replace(ssh_env, files=("odd/*", "lit/named.py"))
    root, ws = Path(host.root), Path(host.workspace)
    outside = tmp_path / "outside.py"
    outside.write_bytes(b"not yours\n")
    for folder in ("odd", "lit"):
        (root / folder).mkdir()
    (root / "odd/a.py").write_bytes(b"A = 1\n")
    (root / "odd/synced.py").write_bytes(b"S = 1\n")
    (root / "odd/evil.py").symlink_to(outside)
    (root / "lit/named.py").symlink_to(outside)

    def statuses():
        with open_transport(host) as t:
            return {f.path: f.status for f in drift.compute_drift(t, host).files}

    with open_transport(host) as t:
        sync.pull(t, host)
    assert not (ws / "odd/evil.py").exists() and not (ws / "lit/named.py").exists()
    assert statuses() == {
        "odd/a.py": "in-sync",
        "odd/synced.py": "in-sync",
        "lit/named.py": "missing-live",
    }
    (root / "odd/synced.py").unlink()
    (root / "odd/synced.py").symlink_to(outside)
    (ws / "odd/evil.py").write_bytes(b"mine\n")
    assert statuses() == {
        "odd/a.py": "in-sync",
        "odd/evil.py": "missing-live",
        "odd/synced.py": "missing-live",
        "lit/named.py": "missing-live",
    }
    assert outside.read_bytes() == b"not yours\n"


def test_pull_never_writes_through_a_workspace_symlink_leading_out(tmp_path):
    """`ln -s /outside ws/k/dir; kerneldev pull --force` used to write the host's files into
    /outside. Such a file is refused (exit 1, named with where it leads); the others are pulled.
    The workspace itself may be a link: real paths are compared."""
    import io

    from kerneldev.cli.environment import Environment
    from kerneldev.cli.main import main

    root, real_ws = tmp_path / "live", tmp_path / "real-ws"
    for name in ("k/a.py", "k/dir/x.py", "k/link.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"live " + name.encode() + b"\n")
    outside = Path(os.path.realpath(tmp_path)) / "outside"  # as the message names it
    outside.mkdir()
    (outside / "x.py").write_bytes(b"not yours\n")
    (outside / "file.py").write_bytes(b"not yours either\n")
    (real_ws / "k").mkdir(parents=True)
    (real_ws / "k/dir").symlink_to(outside)
    (real_ws / "k/link.py").symlink_to(outside / "file.py")
    (tmp_path / "ws").symlink_to(real_ws)  # the workspace root itself is a link: fine
    host = local_host(root, tmp_path / "ws", files=("k/*.py", "k/dir/*.py"))
    config = tmp_path / "hosts.yaml"
    config.write_text(
        f"hosts:\n  h:\n    transport: local\n    root: '{root}'\n"
        f"    files: ['k/*.py', 'k/dir/*.py']\n    workspace: '{host.workspace}'\n"
    )
    for args in (["pull", "--force"], ["pull", "--force", "--json"]):
        out, err = io.StringIO(), io.StringIO()
        code = main(["--config", str(config), *args], env=Environment(stdout=out, stderr=err))
        assert code == 1, err.getvalue()
        message = err.getvalue() if "--json" not in args else json.loads(out.getvalue())["error"]
        text = str(message)
        assert "a symlink in the workspace leads outside it" in text, text
        assert f"k/dir/x.py -> {outside / 'x.py'}" in text, text
        assert f"k/link.py -> {outside / 'file.py'}" in text, text
        assert "Traceback" not in err.getvalue()
    data = json.loads(out.getvalue())  # --json: what was pulled, and what leads out
    assert data["outside"] == {
        "k/dir/x.py": str(outside / "x.py"),
        "k/link.py": str(outside / "file.py"),
    }
    assert [f["path"] for f in data["files"]] == ["k/a.py"]
    assert (outside / "x.py").read_bytes() == b"not yours\n"
    assert (outside / "file.py").read_bytes() == b"not yours either\n"
    assert sorted(p.name for p in outside.iterdir()) == ["file.py", "x.py"]  # no temp files
    assert (real_ws / "k/a.py").read_bytes() == b"live k/a.py\n"  # the others are pulled
    assert set(load_state(real_ws).files) == {"k/a.py"}


def test_push_reads_through_a_workspace_symlink_leading_out(tmp_path):
    """The other direction (docs/usage.md, push): a workspace file linked to its copy elsewhere
    (a git clone) is pushed with the bytes it leads to; the link and its target stay as they
    were, and nothing but the pushed file changes in the live tree."""
    import io

    from kerneldev.cli.environment import Environment
    from kerneldev.cli.main import main

    root, ws, clone = tmp_path / "live", tmp_path / "ws", tmp_path / "clone"
    for name in ("k/a.py", "k/b.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"live " + name.encode() + b"\n")
    config = tmp_path / "hosts.yaml"
    config.write_text(
        f"hosts:\n  h:\n    transport: local\n    root: '{root}'\n"
        f"    files: ['k/*.py']\n    workspace: '{ws}'\n"
    )

    def run(*args):
        out, err = io.StringIO(), io.StringIO()
        code = main(["--config", str(config), *args], env=Environment(stdout=out, stderr=err))
        assert code == 0, err.getvalue()
        return out.getvalue()

    run("pull")
    (clone / "k").mkdir(parents=True)
    (clone / "k/a.py").write_bytes(b"EDITED = 1  # in the clone\n")
    (ws / "k/a.py").unlink()
    (ws / "k/a.py").symlink_to(clone / "k/a.py")
    data = json.loads(run("push", "--json"))
    assert [f["path"] for f in data["files"] if f["action"] == "upload"] == ["k/a.py"], data
    assert (root / "k/a.py").read_bytes() == b"EDITED = 1  # in the clone\n"
    assert not (root / "k/a.py").is_symlink()
    assert (root / "k/b.py").read_bytes() == b"live k/b.py\n"
    assert (ws / "k/a.py").is_symlink() and (
        clone / "k/a.py"
    ).read_bytes() == b"EDITED = 1  # in the clone\n"
    assert json.loads(run("diff", "--json"))["files"][0]["status"] == "in-sync"


def test_a_history_line_naming_a_path_out_of_root_is_never_restored(ssh_env, tmp_path):
    # The host's history is a file anyone on the host can edit; rollback restores what it
    # names. A line whose file is `..`/absolute, or whose backup lies outside the backups
    # folder, used to make `rollback --force` write (or read) outside root.
    host = ssh_env
    root, ws = Path(host.root), Path(host.workspace)
    (root / "k/a.py").write_bytes(b"v1\n")
    with open_transport(host) as t:
        sync.pull(t, host)
    (ws / "k/a.py").write_bytes(b"v2\n")
    _push(host)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"not yours\n")
    planted = root / ".kerneldev/backups/planted/x"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"evil\n")
    lines = []
    for path, backup in (
        ("k/a.py", os.path.relpath(victim, root)),
        (str(victim), ".kerneldev/backups/planted/x"),
        (os.path.relpath(victim, root), ".kerneldev/backups/planted/x"),  # the last deploy
    ):
        evil = hashlib.sha256(b"evil\n").hexdigest()  # the backup's bytes: it checks out
        record = {"path": path, "old_sha256": evil, "new_sha256": "1" * 64, "backup": backup}
        record.update(old_mode=0o644, new_mode=0o644)
        lines.append(
            {"schema": 1, "id": f"29991231T000000.000Z-{len(lines)}", "time": "", "host": "x"}
            | {"user": "m", "kind": "push", "files": [record], "outcome": "deployed"}
        )
    with open(root / ".kerneldev/history.jsonl", "a") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    with open_transport(host) as t:
        history = sync.history.load_history(t, host.root)
        assert history.unreadable_lines == 3
        with host_lock.HostLock(t, host.root, "rollback", wait=5):
            undone = sync.rollback(t, host, force=True)
    assert [f.path for f in undone.files] == ["k/a.py"]  # the real last deploy, undone
    assert (root / "k/a.py").read_bytes() == b"v1\n"
    assert victim.read_bytes() == b"not yours\n"
