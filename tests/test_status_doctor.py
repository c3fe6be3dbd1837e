"""`kerneldev status` and `kerneldev doctor` as a user meets them: through the CLI, against the
real sshd on 127.0.0.1, on a healthy host and on hosts broken the ways real ones break (wrong
key, unknown or changed host key, missing or read-only root, a closed port)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import kerneldev.sandbox.host
from kerneldev.cli.environment import Environment
from kerneldev.cli.main import main
from kerneldev.local_user import local_user
from tests.sshd import find_sshd, free_port, keygen, start_sshd
from tests.sshutil import ssh_entry

A, B = "k/a.py", "k/b.py"
CHECKS = [
    *("dns", "tcp", "host-key", "auth", "root", "files", "write", "gpu", "python", "service"),
    "env-file",
]
HOST_CHECKS = ["root", "files", "write", "gpu", "python", "service", "env-file"]
NO_NVIDIA_SMI = not any(
    os.path.exists(os.path.join(d, "nvidia-smi")) for d in os.environ["PATH"].split(os.pathsep)
)


@pytest.fixture(autouse=True)
def _home(isolated_home):
    return isolated_home


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


def kd(*args: str, **terminal) -> Run:
    """`kerneldev ARGS` through the real entry with captured streams (a pipe, unless `terminal`
    says e.g. stdout_isatty=True, width=80)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(
        list(args), env=Environment(stdout=out, stderr=err, stdin=io.StringIO(), **terminal)
    )
    return Run(int(code), out.getvalue(), err.getvalue())


def live_tree(tmp_path: Path, name: str = "live") -> Path:
    root = tmp_path / name
    (root / "k").mkdir(parents=True)
    (root / A).write_text("A = 1\n")
    (root / B).write_text("B = 1\n")
    return root


def local_entry(root: Path, service: dict) -> dict:
    """A local host on `root` whose python lacks torch (`-S`: no site-packages)."""
    return {
        "transport": "local",
        "root": str(root),
        "files": ["k/*.py"],
        "workspace": "ws",
        "python": f"{sys.executable} -S",
        "service": service,
    }


def write_config(tmp_path: Path, hosts: dict[str, dict], groups: dict | None = None) -> Path:
    data: dict = {"default": next(iter(hosts)), "hosts": hosts}
    if groups:
        data["groups"] = groups
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump(data))
    return config


def ssh_host_entry(server, tmp_path: Path, root: Path, **changes) -> dict:
    entry = ssh_entry(server, tmp_path)
    entry.update(root=str(root), files=["k/*.py"], workspace="ws")
    entry.update(changes)
    return entry


def doctor(config: Path, *args: str) -> tuple[Run, dict[str, dict]]:
    """`kerneldev doctor --json` and the first host's checks by name (in the order they ran)."""
    run = kd("--config", str(config), "doctor", "--json", *args)
    data = run.json()
    checks = {c["name"]: c for c in data["hosts"][0]["checks"]} if data["hosts"] else {}
    if checks:
        assert list(checks) == CHECKS
    return run, checks


def verdicts(checks: dict[str, dict], names: list[str]) -> list[str]:
    return [checks[n]["verdict"] for n in names]


# --- doctor -----------------------------------------------------------------------------


def test_doctor_passes_a_healthy_host_reached_through_an_ssh_config_alias(
    sshd_server, tmp_path, monkeypatch
):
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host gpu-box\n  HostName 127.0.0.1\n")
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", str(ssh_config))
    root = live_tree(tmp_path)
    entry = ssh_host_entry(
        sshd_server,
        tmp_path,
        root,
        hostname="gpu-box",
        service={"restart": "true", "health": "true"},
    )
    config = write_config(tmp_path, {"h": entry})

    run, checks = doctor(config)
    assert run.exit_code == 0, run.stdout
    assert run.json()["config"]["verdict"] == "ok"
    assert str(config) in run.json()["config"]["detail"]
    assert checks["dns"]["verdict"] == "ok"
    assert checks["dns"]["detail"].startswith("gpu-box -> 127.0.0.1")  # the alias, resolved
    assert verdicts(checks, ["tcp", "host-key", "auth", "root", "files", "write"]) == ["ok"] * 6
    assert checks["tcp"]["data"]["banner"].startswith("SSH-2.0-")
    assert checks["auth"]["data"]["key"] == str(sshd_server.client_key)
    assert checks["files"]["data"] == {"matched": 2, "unmatched": []}
    # No GPU and (on CI) maybe no torch for the host's python3: a warning, never a failure.
    assert checks["gpu"]["verdict"] == ("warn" if NO_NVIDIA_SMI else "ok")
    assert checks["python"]["verdict"] in ("ok", "warn")
    assert re.fullmatch(r"\d+\.\d+\.\d+\w*", checks["python"]["data"]["python"])
    assert checks["service"]["verdict"] == "ok"
    # The write test cleaned up after itself, including the folder it had to create.
    assert sorted(p.name for p in root.iterdir()) == ["k"]

    # The same, as a user reads it in a pipe: one line per check, verdict first.
    text = kd("--config", str(config), "doctor")
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    assert lines[0].startswith("ok    config    ")
    assert lines[1].startswith("host h (")
    assert [line.split()[1] for line in lines[2:] if not line.lstrip().startswith("fix:")] == CHECKS


def test_doctor_through_a_proxyjump_dials_the_jump_host(sshd_server, tmp_path, monkeypatch):
    # The sshd is its own jump host: dns and tcp look at the hop dialled from here, host-key
    # and auth at the whole chain.
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host behind-jump\n  HostName 127.0.0.1\n  Port {sshd_server.port}\n"
        f"  ProxyJump {sshd_server.user}@127.0.0.1:{sshd_server.port}\n"
    )
    monkeypatch.setenv("KERNELDEV_SSH_CONFIG", str(ssh_config))
    entry = ssh_host_entry(sshd_server, tmp_path, live_tree(tmp_path), hostname="behind-jump")
    del entry["port"]
    run, checks = doctor(write_config(tmp_path, {"h": entry}))
    assert verdicts(checks, ["dns", "tcp", "host-key", "auth", "root"]) == ["ok"] * 5, run.stdout
    assert checks["dns"]["data"]["jump_host"] == "127.0.0.1"
    assert checks["tcp"]["detail"].endswith(
        f"(jump host 127.0.0.1) answers: {checks['tcp']['data']['banner']}"
    )


def test_doctor_with_the_wrong_key_fails_auth_and_skips_what_needs_a_login(sshd_server, tmp_path):
    wrong = tmp_path / "not_authorized"
    keygen(wrong)
    entry = ssh_host_entry(sshd_server, tmp_path, live_tree(tmp_path), identity_file=str(wrong))
    run, checks = doctor(write_config(tmp_path, {"h": entry}))
    assert run.exit_code == 1
    assert verdicts(checks, ["dns", "tcp", "host-key"]) == ["ok", "ok", "ok"]
    assert checks["auth"]["verdict"] == "FAIL"
    assert "authentication failed" in checks["auth"]["detail"]
    assert str(wrong) in checks["auth"]["detail"]  # says which key was tried
    assert "identity_file" in checks["auth"]["hint"]
    assert verdicts(checks, HOST_CHECKS) == ["skip"] * 7
    assert checks["python"]["detail"] == "skipped: needs auth"


def test_doctor_flags_an_unknown_and_a_changed_host_key(sshd_server, tmp_path):
    root = live_tree(tmp_path)
    unknown = tmp_path / "empty_known_hosts"
    unknown.write_text("")
    entry = ssh_host_entry(sshd_server, tmp_path, root, known_hosts=str(unknown))
    run, checks = doctor(write_config(tmp_path, {"h": entry}))
    assert run.exit_code == 1
    key = checks["host-key"]
    assert key["verdict"] == "FAIL" and key["data"]["status"] == "unknown"
    assert "not in known_hosts" in key["detail"] and "SHA256:" in key["detail"]
    assert "kerneldev trust --host h" in key["hint"]
    assert checks["auth"]["detail"] == "skipped: needs host-key"
    assert unknown.read_text() == ""  # nothing was added

    # known_hosts holds another key of the same type for this host:port: the key "changed".
    other = tmp_path / "other_host_key"
    keygen(other)
    kind, blob = other.with_suffix(".pub").read_text().split()[:2]
    changed = tmp_path / "changed_known_hosts"
    changed.write_text(f"[127.0.0.1]:{sshd_server.port} {kind} {blob}\n")
    entry = ssh_host_entry(sshd_server, tmp_path, root, known_hosts=str(changed))
    run, checks = doctor(write_config(tmp_path, {"h": entry}))
    assert run.exit_code == 1
    key = checks["host-key"]
    assert key["verdict"] == "FAIL" and key["data"]["status"] == "changed"
    assert "CHANGED" in key["detail"] and f"{changed}:1" in key["detail"]
    assert "ssh-keygen -R" in key["hint"] and "kerneldev trust" in key["hint"]
    assert verdicts(checks, ["auth", *HOST_CHECKS]) == ["skip"] * 8


def test_doctor_and_status_on_a_missing_root(sshd_server, tmp_path):
    entry = ssh_host_entry(sshd_server, tmp_path, tmp_path / "no-such-root")
    config = write_config(tmp_path, {"h": entry})
    run, checks = doctor(config)
    assert run.exit_code == 1
    assert checks["root"]["verdict"] == "FAIL"
    assert "does not exist" in checks["root"]["detail"]
    assert "--create-root" in checks["root"]["hint"]
    assert verdicts(checks, ["files", "write"]) == ["skip", "skip"]
    assert checks["write"]["detail"] == "skipped: needs root"
    # What does not need root still ran.
    assert "skip" not in verdicts(checks, ["gpu", "python"])
    assert not (tmp_path / "no-such-root").exists()  # the write test did not create it

    status = kd("--config", str(config), "status", "--json")
    assert status.exit_code == 1
    (host,) = status.json()["hosts"]
    assert host["reachable"] is True
    assert "does not exist" in host["problems"][0]["message"]


@pytest.fixture
def read_only_root(tmp_path, monkeypatch):
    """(an sshd, the root) where the root exists with its files but cannot be written by the
    logged-in user. As root, chmod does not stop writes, so the sshd runs in a private mount
    namespace (`unshare -m`) in which the root is a read-only bind mount: every session sees a
    read-only file system there, while this test process can still clean it up."""
    if find_sshd() is None:
        pytest.skip("sshd is not installed (.ci/run installs openssh-server)")
    root = live_tree(tmp_path)
    if os.geteuid() != 0:
        server = start_sshd(tmp_path / "sshd-ro")
        mode = root.stat().st_mode
        root.chmod(stat.S_IMODE(mode) & ~0o222)
        yield server, root, "Permission denied"
        root.chmod(stat.S_IMODE(mode))
        server.stop()
        return
    wrapper = tmp_path / "sshd-in-read-only-namespace"
    wrapper.write_text(
        "#!/bin/sh\n"
        "exec unshare -m --propagation private -- sh -c "
        '\'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"\' '
        f'"{root}" "{find_sshd()}" "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setattr(kerneldev.sandbox.host, "find_sshd", lambda: str(wrapper))
    try:
        server = start_sshd(tmp_path / "sshd-ro")
    except RuntimeError as err:
        pytest.skip(f"cannot make a read-only mount namespace here: {err}")
    yield server, root, "Read-only file system"
    server.stop()


def test_doctor_on_a_read_only_root_fails_the_write_check(read_only_root, tmp_path):
    server, root, reason = read_only_root
    config = write_config(tmp_path, {"h": ssh_host_entry(server, tmp_path, root)})
    run, checks = doctor(config)
    assert run.exit_code == 1
    assert verdicts(checks, ["auth", "root", "files"]) == ["ok", "ok", "ok"]
    assert checks["write"]["verdict"] == "FAIL"
    assert reason in checks["write"]["detail"]
    assert "user:" in checks["write"]["hint"]
    text = kd("--config", str(config), "doctor").stdout
    assert re.search(r"^  FAIL  write     cannot write in .*/\.kerneldev: ", text, re.M)
    assert re.search(r"^ +fix: push writes backups", text, re.M)


def test_doctor_names_a_file_behind_a_symlink_out_of_root_as_one_push_refuses(
    sshd_server, tmp_path
):
    root = live_tree(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (root / "linkdir").symlink_to(tmp_path / "elsewhere")
    entry = ssh_host_entry(sshd_server, tmp_path, root, files=["k/*.py", "k/new.py"])
    config = write_config(tmp_path, {"h": entry})
    run, checks = doctor(config)
    # A literal entry not there yet: push creates it.
    assert checks["files"]["verdict"] == "warn" and "not on the host: k/new.py" in run.stdout

    entry["files"] = ["k/*.py", "k/new.py", "linkdir/x.py"]
    config = write_config(tmp_path, {"h": entry})
    run, checks = doctor(config)
    assert run.exit_code == 1
    files = checks["files"]
    assert files["verdict"] == "FAIL", files
    assert files["detail"].startswith("linkdir/x.py: on the host it leads out of root")
    assert "push refuses" in files["detail"] and "creates" not in files["hint"]
    assert files["data"]["outside_root"] == ["linkdir/x.py"]
    text = kd("--config", str(config), "doctor").stdout
    assert re.search(r"^  FAIL  files     linkdir/x\.py: on the host it leads out", text, re.M)
    assert not list((tmp_path / "elsewhere").iterdir())


def test_doctor_and_status_on_a_closed_port_and_an_unknown_name(sshd_server, tmp_path):
    closed = free_port()  # nothing listens there
    root = live_tree(tmp_path)
    config = write_config(tmp_path, {"h": ssh_host_entry(sshd_server, tmp_path, root, port=closed)})
    run, checks = doctor(config)
    assert run.exit_code == 1
    assert checks["dns"]["verdict"] == "ok"
    assert checks["tcp"]["verdict"] == "FAIL"
    assert f"connection refused by 127.0.0.1:{closed}" in checks["tcp"]["detail"]
    assert verdicts(checks, CHECKS[2:]) == ["skip"] * 9

    status = kd("--config", str(config), "status")
    assert status.exit_code == 3  # unreachable
    assert re.search(r"^h +no ", status.stdout, re.M)
    assert f"h: unreachable: connection refused by 127.0.0.1:{closed}" in status.stdout

    # Both as one group: every host checked, reported in the group's order.
    unknown_name = ssh_host_entry(sshd_server, tmp_path, root, hostname="no-such-host.invalid")
    closed_port = ssh_host_entry(sshd_server, tmp_path, root, port=closed)
    config = write_config(
        tmp_path, {"g0": unknown_name, "g1": closed_port}, {"fleet": ["g0", "g1"]}
    )
    run, checks = doctor(config, "--host", "fleet")
    assert run.exit_code == 1
    assert checks["dns"]["verdict"] == "FAIL" and "cannot resolve" in checks["dns"]["detail"]
    assert checks["tcp"]["detail"] == "skipped: needs dns"
    g0, g1 = run.json()["hosts"]
    assert (g0["host"], g0["ok"], g1["host"], g1["ok"]) == ("g0", False, "g1", False)
    assert [c["verdict"] for c in g1["checks"]][:2] == ["ok", "FAIL"]


def test_doctor_reports_a_missing_or_invalid_config_as_its_first_check(tmp_path):
    missing = kd("--config", str(tmp_path / "nope.yaml"), "doctor", "--json")
    assert missing.exit_code == 1
    data = missing.json()
    assert data["hosts"] == [] and data["config"]["verdict"] == "FAIL"
    assert "config file not found" in data["config"]["detail"]

    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts:\n  h:\n    root: relative/path\n    files: [a]\n    workspace: w\n")
    run = kd("--config", str(bad), "doctor")
    assert run.exit_code == 1
    assert run.stdout.startswith(f"FAIL  config    {bad}:3: hosts.h.")
    assert "Traceback" not in run.stderr

    # A --host that names nothing is a usage error, as for every command.
    good = tmp_path / "good.yaml"
    good.write_text(
        yaml.safe_dump(
            {"hosts": {"h": {"transport": "local", "root": "/x", "files": ["a"], "workspace": "w"}}}
        )
    )
    unknown = kd("--config", str(good), "doctor", "--host", "typo")
    assert unknown.exit_code == 2 and "no host or group named 'typo'" in unknown.stderr


def test_a_config_from_the_environment_is_named_as_such(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELDEV_CONFIG", str(tmp_path / "nope.yaml"))
    missing = kd("doctor")
    assert missing.exit_code == 1
    assert "fix: check the path given with $KERNELDEV_CONFIG" in missing.stdout
    good = tmp_path / "good.yaml"
    good.write_text(
        yaml.safe_dump(
            {"hosts": {"h": {"transport": "local", "root": "/x", "files": ["a"], "workspace": "w"}}}
        )
    )
    monkeypatch.setenv("KERNELDEV_CONFIG", str(good))
    found = kd("doctor", "--json")
    assert "(from $KERNELDEV_CONFIG)" in found.json()["config"]["detail"]
    assert "(given with --config)" in kd("--config", str(good), "doctor", "--json").stdout


# --- status -----------------------------------------------------------------------------


def test_status_after_a_push_shows_that_deploy_and_flags_a_later_edit_on_the_host(
    sshd_server, tmp_path
):
    root = live_tree(tmp_path)
    node = ssh_host_entry(sshd_server, tmp_path, root)
    down = ssh_host_entry(sshd_server, tmp_path, root, port=free_port(), workspace="ws-down")
    config = write_config(tmp_path, {"node0": node, "node1": down}, {"fleet": ["node0", "node1"]})
    cli = ("--config", str(config))

    fresh = kd(*cli, "status", "--host", "node0", "--json")
    assert fresh.exit_code == 0, fresh.stdout
    assert fresh.json()["hosts"][0]["last_deploy"] is None
    assert fresh.json()["hosts"][0]["live_matches"] is None

    assert kd(*cli, "pull", "--host", "node0").exit_code == 0
    (tmp_path / "ws" / A).write_text("A = 2\n")
    push = kd(*cli, "push", "--host", "node0", "--no-import-check", "--json")
    assert push.exit_code == 0, push.stderr
    deploy_id = push.json()["deploy_id"]

    status = kd(*cli, "status", "--host", "node0", "--json")
    assert status.exit_code == 0, status.stdout
    (host,) = status.json()["hosts"]
    assert host["reachable"] is True
    assert host["last_deploy"]["id"] == deploy_id
    assert host["last_deploy"]["user"] == local_user()
    assert host["last_deploy"]["files"] == [A]
    assert host["live_matches"] is True and host["changed"] == []
    assert host["service"] is None  # no health check configured
    if NO_NVIDIA_SMI:
        assert host["gpus"] == {"present": False, "gpus": [], "note": "no nvidia-smi"}

    # The table a user sees on an 80-column terminal: one row, nothing cut off.
    table = kd(*cli, "status", "--host", "node0", stdout_isatty=True, width=80)
    assert table.exit_code == 0
    plain = re.sub(r"\x1b\[[0-9;]*m", "", table.stdout)
    assert all(len(line) <= 80 for line in plain.splitlines())
    assert re.search(r"^node0 +yes +\d\d-\d\d \d\d:\d\d +\S+ +matches +- ", plain, re.M)
    assert f"last deploy {deploy_id} (push) by {local_user()}" in plain

    # Someone edits the deployed file on the host afterwards: status names it, exit 1.
    (root / A).write_text("A = 3  # hot fix on the box\n")
    edited = kd(*cli, "status", "--host", "node0")
    assert edited.exit_code == 1
    assert re.search(r"^node0 +yes .* changed ", edited.stdout, re.M)
    assert f"node0: changed since deploy {deploy_id}: {A}" in edited.stdout

    # The group: one entry per host, in order; the worst host (unreachable, 3) wins.
    fleet = kd(*cli, "status", "--host", "fleet", "--json")
    assert fleet.exit_code == 3
    node0, node1 = fleet.json()["hosts"]
    assert (node0["host"], node0["exit_code"], node0["changed"]) == ("node0", 1, [A])
    assert (node1["host"], node1["reachable"], node1["exit_code"]) == ("node1", False, 3)
    assert "connection refused" in node1["unreachable"]["message"]


FAKE_NVIDIA_SMI = """#!/bin/sh
# Answers like nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu
# [,compute_cap] --format=csv,noheader,nounits on a two-GPU box (one without a memory reading);
# with $FAKE_OLD_DRIVER, like a driver that does not know compute_cap.
cap=""
case "$*" in *compute_cap*)
  if [ -n "$FAKE_OLD_DRIVER" ]; then
    echo 'Field "compute_cap" is not a valid field to query.'; exit 2
  fi
  cap=", 9.0";;
esac
echo "0, NVIDIA H200, 40000, 143771, 12$cap"
echo "1, NVIDIA H200, [N/A], 143771, 30$cap"
"""


def test_status_and_doctor_read_gpus_from_nvidia_smi(tmp_path, monkeypatch):
    """A local host (this machine) with an nvidia-smi on the PATH that answers like a real one;
    its python lacks torch (`-S`: no site-packages), and its service is down."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    root = live_tree(tmp_path)
    entry = local_entry(root, {"restart": "true", "health": "false"})
    config = write_config(tmp_path, {"gpubox": entry})

    status = kd("--config", str(config), "status", "--json")
    assert status.exit_code == 1  # the service is unhealthy
    (host,) = status.json()["hosts"]
    assert host["service"] == {"health": "false", "healthy": False, "last_check": "exit 1"}
    gpus = host["gpus"]["gpus"]
    assert [(g["index"], g["name"], g["compute_cap"]) for g in gpus] == [
        (0, "NVIDIA H200", "9.0"),
        (1, "NVIDIA H200", "9.0"),
    ]
    assert [g["memory_used_mib"] for g in gpus] == [40000, None]
    table = kd("--config", str(config), "status")
    assert "2x H200 21% 39/281G" in table.stdout
    assert "gpubox: service unhealthy: exit 1 from false" in table.stdout

    run, checks = doctor(config)
    assert run.exit_code == 1
    assert verdicts(checks, ["dns", "tcp", "host-key", "auth"]) == ["skip"] * 4
    assert checks["gpu"]["verdict"] == "ok"
    assert checks["gpu"]["detail"] == "2x NVIDIA H200, compute capability 9.0 (sm_90)"
    # A GPU host whose python has no torch: bench and the import check would fail there.
    assert checks["python"]["verdict"] == "FAIL"
    assert "no torch and no triton" in checks["python"]["detail"]
    assert (
        checks["service"]["verdict"] == "FAIL" and "kerneldev restart" in checks["service"]["hint"]
    )

    # A host whose nvidia-smi lists GPUs but whose python's torch cannot use one: this
    # machine's torch (no GPU here), a CPU build as bootstrap installs it, or a CUDA build
    # where one was asked for (KERNELDEV_TORCH=cuda).
    if importlib.util.find_spec("torch") and importlib.util.find_spec("triton"):
        entry["python"] = sys.executable
        run, checks = doctor(write_config(tmp_path, {"gpubox": entry}))
        assert checks["python"]["verdict"] == "FAIL", checks["python"]
        if checks["python"]["data"].get("cuda"):
            assert "sees no GPU" in checks["python"]["detail"]
            assert "CUDA_VISIBLE_DEVICES" in checks["python"]["hint"]
        else:
            assert "torch is a CPU build (no CUDA)" in checks["python"]["detail"]
            assert "CUDA build of torch" in checks["python"]["hint"]
        entry["python"] = f"{sys.executable} -S"
        write_config(tmp_path, {"gpubox": entry})

    # An older driver refuses the compute_cap field: asked again without it.
    monkeypatch.setenv("FAKE_OLD_DRIVER", "1")
    (host,) = kd("--config", str(config), "status", "--json").json()["hosts"]
    assert [(g["name"], g["compute_cap"]) for g in host["gpus"]["gpus"]] == [
        ("NVIDIA H200", None)
    ] * 2
    monkeypatch.delenv("FAKE_OLD_DRIVER")

    # Without GPUs the same python is only a warning.
    (bin_dir / "nvidia-smi").unlink()
    run, checks = doctor(config)
    assert checks["gpu"]["verdict"] == "warn" and "no nvidia-smi" in checks["gpu"]["detail"]
    assert checks["python"]["verdict"] == "warn"
    status = kd("--config", str(config), "status")
    assert re.search(r"^gpubox .* no nvidia-smi", status.stdout, re.M)


def test_ctrl_c_before_the_hosts_start_is_reported_as_the_interrupt(tmp_path, monkeypatch):
    import signal

    from kerneldev import interrupt
    from kerneldev.config import load_config
    from kerneldev.diagnose import doctor
    from kerneldev.diagnose import status as host_status

    config = tmp_path / "hosts.yaml"
    entry = {"transport": "local", "root": str(tmp_path), "files": ["a"], "workspace": "w"}
    config.write_text(yaml.safe_dump({"hosts": {"h1": entry, "h2": entry}}))
    monkeypatch.setattr(interrupt, "_pending", signal.SIGINT)  # Ctrl-C before any host began
    with pytest.raises(interrupt.Interrupted) as caught:
        doctor.diagnose(str(config), "h1,h2")
    assert caught.value.message == "interrupted by Ctrl-C"
    hosts = load_config(str(config)).hosts_for("h1,h2")
    with pytest.raises(interrupt.Interrupted) as caught:
        host_status.collect_status(hosts)
    assert caught.value.message == "interrupted by Ctrl-C"


def test_ctrl_c_mid_run_still_gives_json_with_what_was_collected(
    sshd_server, tmp_path, monkeypatch
):
    """Ctrl-C while `status --json` / `doctor --json` look at the first of two hosts: one
    JSON document with that host as far as it got, the other host marked as not looked at,
    `interrupted: true`, exit 130."""
    import signal

    from kerneldev import interrupt
    from kerneldev.diagnose import doctor as doctor_core
    from kerneldev.diagnose import status as host_status

    root = live_tree(tmp_path)
    entry = ssh_host_entry(sshd_server, tmp_path, root, service={"health": "true"})
    config = write_config(tmp_path, {"h1": entry, "h2": entry}, {"both": ["h1", "h2"]})

    def ctrl_c() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it
        while interrupt.pending() is None:  # the handler runs in the main thread
            pass

    service = host_status._service

    def service_then_ctrl_c(transport, host, status):
        service(transport, host, status)
        ctrl_c()

    monkeypatch.setattr(host_status, "_service", service_then_ctrl_c)
    run = kd("--config", str(config), "status", "--host", "both", "--parallel", "1", "--json")
    assert run.exit_code == 130, run.stderr
    data = run.json()
    assert data["interrupted"] is True and data["exit_code"] == 130
    assert data["error"]["code"] == 130
    h1, h2 = data["hosts"]
    assert (h1["host"], h1["reachable"], h1["interrupted"]) == ("h1", True, True)
    assert h1["service"]["healthy"] is True and h1["gpus"] is None  # stopped before the GPUs
    assert (h2["host"], h2["interrupted"]) == ("h2", True)
    assert "not started" in h2["notes"][0]
    human = kd("--config", str(config), "status", "--host", "both", "--parallel", "1")
    assert human.exit_code == 130
    assert "h1: interrupted: the steps after these were not run" in human.stdout
    assert "h2: not started: interrupted before this host began" in human.stdout
    assert "h2: no deploy recorded" not in human.stdout
    monkeypatch.setattr(host_status, "_service", service)

    gpu = doctor_core._HostDoctor.gpu

    def gpu_then_ctrl_c(self):
        check = gpu(self)
        ctrl_c()
        return check

    monkeypatch.setattr(doctor_core._HostDoctor, "gpu", gpu_then_ctrl_c)
    run = kd("--config", str(config), "doctor", "--host", "both", "--parallel", "1", "--json")
    assert run.exit_code == 130, run.stderr
    data = run.json()
    assert data["interrupted"] is True and data["exit_code"] == 130
    assert data["config"]["verdict"] == "ok"
    h1, h2 = data["hosts"]
    assert h1["interrupted"] is True
    assert [c["name"] for c in h1["checks"]] == CHECKS[: CHECKS.index("gpu") + 1]
    assert (h2["host"], h2["checks"], h2["interrupted"]) == ("h2", [], True)
    # The human output shows the same before the error line.
    monkeypatch.setattr(doctor_core._HostDoctor, "gpu", gpu_then_ctrl_c)
    run = kd("--config", str(config), "doctor", "--host", "both", "--parallel", "1")
    assert run.exit_code == 130
    assert "interrupted: the checks after these were not run" in run.stdout
    assert "kerneldev: error: interrupted by Ctrl-C" in run.stderr


def test_doctor_checks_that_the_service_env_file_is_on_the_host(tmp_path):
    """`service.env_file` is what `kernels status`, the import check and an A/B read as the
    service's variables: a readable file is ok; a path with nothing there is a warning (an A/B
    would create it); a missing folder or a folder instead of a file fails; without one the
    check is skipped."""
    root = live_tree(tmp_path)
    entry = local_entry(root, {"restart": "true"})
    env_file = tmp_path / "sglang.env"
    env_file.write_text("SGLANG_SM120_FLASHMLA_BACKEND=triton\n")
    # lines a shell, systemd and docker read differently: a warning naming the first
    ambiguous = tmp_path / "ambiguous.env"
    ambiguous.write_text("SGLANG_SM120_FLASHMLA_BACKEND=triton # the default\nA=1 B=2\n")
    cases = [
        (str(env_file), "ok", "is a readable file"),
        (str(ambiguous), "warn", "line 1 `SGLANG_SM120_FLASHMLA_BACKEND=triton # the default`"),
        (str(tmp_path / "typo.env"), "warn", "does not exist on the host"),
        (str(tmp_path / "no-such-dir" / "sglang.env"), "FAIL", "nor does its folder"),
        (str(tmp_path), "FAIL", "is not a regular file"),
        (None, "skip", "no `service.env_file` configured"),
    ]
    for path, verdict, detail in cases:
        entry["service"] = {"restart": "true", **({"env_file": path} if path else {})}
        run, checks = doctor(write_config(tmp_path, {"h": entry}))
        check = checks["env-file"]
        assert (check["verdict"], detail in check["detail"]) == (verdict, True), check
        assert (run.exit_code == 1) == (verdict == "FAIL") or checks["python"]["verdict"] == "FAIL"
        if path == str(ambiguous):
            assert "(and 1 more)" in check["detail"] and len(check["data"]["warnings"]) == 2
            assert "plain KEY=VALUE line" in check["hint"]
        elif verdict in ("warn", "FAIL"):
            assert "service.env_file" in check["hint"]
    text = kd("--config", str(write_config(tmp_path, {"h": entry})), "doctor")
    assert re.search(r"^  skip +env-file +no `service.env_file` configured", text.stdout, re.M)


def test_a_doctor_host_cut_short_is_not_reported_ok():
    """`ok` in `doctor --json` means every check ran and none failed: a host whose checks a
    Ctrl-C cut short after two passing ones is not ok (it said true)."""
    from kerneldev.diagnose.doctor import OK, Check, DoctorReport, HostReport

    passed = [Check("dns", OK, "resolves"), Check("tcp", OK, "open")]
    cut = HostReport("hang", "ssh", checks=list(passed), interrupted=True)
    whole = HostReport("fine", "ssh", checks=list(passed))
    report = DoctorReport(Check("config", OK, "read"), [cut, whole], interrupted=True)
    hosts = {h["host"]: h for h in report.as_json()["hosts"]}
    assert hosts["hang"]["ok"] is False and hosts["hang"]["interrupted"] is True
    assert hosts["fine"]["ok"] is True
