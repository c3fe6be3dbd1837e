"""hosts.yaml: every mistake a user can make is reported with the file, the key path and the
line, and the CLI exits with code 2 and no traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kerneldev.config import load_config
from kerneldev.errors import ConfigError, ExitCode
from tests.sshutil import run_cli

VALID = """\
default: dsv4
hosts:
  dsv4:
    hostname: 10.1.230.171
    user: root
    port: 2222
    identity_file: keys/id_ed25519
    known_hosts: ~/kh
    root: /root/sglang-dsv4/
    files:
      - python/sglang/srt/layers/attention/flash_mla_sm120_triton.py
      - python/sglang/srt/layers/attention/*.py
    workspace: dsv4-live
    mirror: ../clones/sglang
    service:
      restart: systemctl restart sglang
      health: http://127.0.0.1:30000/health
      timeout: 90
      logs: journalctl -u sglang -n 100
    python: /opt/venv/bin/python
    gpu: 0
  box:
    transport: local
    root: /srv/sglang
    files: [a.py]
    workspace: /abs/ws
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_for(tmp_path: Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.exit_code == ExitCode.USAGE
    assert str(path) in caught.value.message
    return caught.value


def line_of(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if marker in line)


def test_a_valid_file_loads_with_paths_resolved(tmp_path, isolated_home):
    config = load_config(write(tmp_path, VALID))
    host = config.host("dsv4")
    assert host.root == "/root/sglang-dsv4"  # trailing slash normalised
    assert host.port == 2222 and host.user == "root" and host.transport == "ssh"
    assert host.workspace == tmp_path / "dsv4-live"  # relative to the file's folder
    assert host.identity_file == tmp_path / "keys" / "id_ed25519"
    assert host.known_hosts == tmp_path / "home" / "kh"  # ~ expanded
    assert host.mirror == tmp_path.parent / "clones" / "sglang"
    assert host.files[1] == "python/sglang/srt/layers/attention/*.py"
    assert host.service.timeout == 90.0 and host.service.restart == "systemctl restart sglang"
    assert (host.python, host.gpu) == ("/opt/venv/bin/python", "0")
    box = config.host("box")
    assert box.transport == "local" and box.hostname is None and box.service is None
    assert box.python == "python3" and box.workspace == Path("/abs/ws")


# (mistake, the text it replaces in VALID, what it is replaced by, key path, message part)
MISTAKES = [
    ("unknown top key", "default: dsv4", "defualt: dsv4", "defualt", "unknown key"),
    ("unknown host key", "    user: root", "    usr: root", "hosts.dsv4.usr", "unknown key"),
    (
        "unknown service key",
        "      restart:",
        "      restrat:",
        "hosts.dsv4.service.restrat",
        "unknown key",
    ),
    ("port not a number", "port: 2222", "port: twenty", "hosts.dsv4.port", "integer"),
    ("port out of range", "port: 2222", "port: 70000", "hosts.dsv4.port", "integer"),
    ("port a bool", "port: 2222", "port: yes", "hosts.dsv4.port", "integer"),
    ("timeout a word", "timeout: 90", "timeout: soon", "hosts.dsv4.service.timeout", "> 0"),
    ("timeout zero", "timeout: 90", "timeout: 0", "hosts.dsv4.service.timeout", "> 0"),
    ("timeout negative", "timeout: 90", "timeout: -5", "hosts.dsv4.service.timeout", "> 0"),
    (
        "absolute file",
        "      - python/sglang/srt/layers/attention/*.py",
        "      - /etc/passwd",
        "hosts.dsv4.files[1]",
        "relative to root",
    ),
    (
        "file escaping root",
        "      - python/sglang/srt/layers/attention/*.py",
        "      - python/../../etc/passwd",
        "hosts.dsv4.files[1]",
        "inside root",
    ),
    ("file with a NUL", "files: [a.py]", 'files: ["a\\0.py"]', "hosts.box.files[0]", "NUL"),
    (
        "workspace with a NUL",
        "workspace: /abs/ws",
        'workspace: "/abs\\0ws"',
        "hosts.box.workspace",
        "NUL",
    ),
    ("in .kerneldev", "files: [a.py]", "files: [.kerneldev/lock]", "hosts.box.files[0]", "own"),
    ("glob into .kerneldev", "files: [a.py]", "files: [.k*/*.json]", "hosts.box.files[0]", "own"),
    (
        "health port out of range",
        "health: http://127.0.0.1:30000/health",
        "health: http://127.0.0.1:300000/health",
        "hosts.dsv4.service.health",
        "not a valid URL",
    ),
    (
        "health URL unclosed",
        "health: http://127.0.0.1:30000/health",
        "health: http://[::1/health",
        "hosts.dsv4.service.health",
        "not a valid URL",
    ),
    ("files not a list", "files: [a.py]", "files: a.py", "hosts.box.files", "list"),
    ("files empty", "files: [a.py]", "files: []", "hosts.box.files", "at least one"),
    ("file not a string", "files: [a.py]", "files: [{x: 1}]", "hosts.box.files[0]", "string"),
    ("relative root", "root: /srv/sglang", "root: srv/sglang", "hosts.box.root", "absolute"),
    ("bad transport", "transport: local", "transport: telnet", "hosts.box.transport", "ssh"),
    ("user a number", "user: root", "user: 0", "hosts.dsv4.user", "string"),
    ("gpu a list", "gpu: 0", "gpu: [0, 1]", "hosts.dsv4.gpu", "string or an integer"),
    (
        "service not a mapping",
        "    service:\n      restart: systemctl restart sglang\n"
        "      health: http://127.0.0.1:30000/health\n      timeout: 90\n"
        "      logs: journalctl -u sglang -n 100\n",
        "    service: systemctl restart sglang\n",
        "hosts.dsv4.service",
        "mapping",
    ),
    (
        "host not a mapping",
        "  box:\n    transport: local\n    root: /srv/sglang\n    files: [a.py]\n"
        "    workspace: /abs/ws\n",
        "  box: local\n",
        "hosts.box",
        "mapping",
    ),
    ("host name with a comma", "  box:", '  "box,2":', "hosts.box,2", "without commas"),
    ("empty host name", "  box:", '  "":', "hosts.", "non-empty"),
    ("default unknown", "default: dsv4", "default: dsv5", "default", "dsv5"),
    (
        "ssh_client unknown",
        "    gpu: 0",
        "    ssh_client: libssh",
        "hosts.dsv4.ssh_client",
        "'auto', 'openssh' or 'paramiko'",
    ),
    (
        "duplicate key",
        "    user: root",
        "    user: root\n    user: admin",
        "hosts.dsv4.user",
        "twice",
    ),
]


@pytest.mark.parametrize(
    "old, new, key_path, what", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES]
)
def test_mistake_names_file_key_path_and_line(tmp_path, old, new, key_path, what):
    assert old in VALID
    text = VALID.replace(old, new, 1)
    err = error_for(tmp_path, text)
    marker = new.strip().splitlines()[-1] if "twice" in what else new.strip()
    assert f":{line_of(text, marker)}: {key_path}: " in err.message
    assert what in err.message
    assert err.hint and "hosts.example.yaml" in err.hint


@pytest.mark.parametrize(
    "missing, key_path",
    [
        ("    root: /root/sglang-dsv4/\n", "hosts.dsv4.root"),
        ("    workspace: dsv4-live\n", "hosts.dsv4.workspace"),
        ("    hostname: 10.1.230.171\n", "hosts.dsv4.hostname"),
        (
            "    files:\n      - python/sglang/srt/layers/attention/flash_mla_sm120_triton.py\n"
            "      - python/sglang/srt/layers/attention/*.py\n",
            "hosts.dsv4.files",
        ),
    ],
)
def test_missing_required_key(tmp_path, missing, key_path):
    assert missing in VALID
    err = error_for(tmp_path, VALID.replace(missing, ""))
    # The line given is where the host's mapping starts.
    assert f"hosts.yaml:4: {key_path}: required key is missing" in err.message


def test_hostname_is_not_needed_for_a_local_host(tmp_path):
    config = load_config(
        write(
            tmp_path,
            "hosts:\n  me:\n    transport: local\n    root: /x\n    files: [a]\n    workspace: w\n",
        )
    )
    assert config.host(None).name == "me"


def test_yaml_syntax_error_names_the_line(tmp_path):
    err = error_for(tmp_path, "hosts:\n  dsv4:\n    root: /x\n   files: [a\n")
    assert "YAML syntax error" in err.message
    assert "hosts.yaml:4:" in err.message


def test_unclosed_quote(tmp_path):
    err = error_for(tmp_path, "hosts:\n  dsv4:\n    root: '/x\n")
    assert "YAML syntax error" in err.message


@pytest.mark.parametrize(
    "text, what",
    [
        ("", "empty"),
        ("# only a comment\n", "empty"),
        ("- a\n- b\n", "must be a mapping"),
        ("hosts: {}\n", "no hosts"),
        ("default: x\n", "hosts: required key is missing"),
    ],
)
def test_top_level_shape(tmp_path, text, what):
    assert what in error_for(tmp_path, text).message


def test_missing_file_hints_at_the_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNELDEV_CONFIG", raising=False)
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert "hosts.yaml" in caught.value.message and "not found" in caught.value.message
    assert "hosts.example.yaml" in caught.value.hint


def test_lookup_order(tmp_path, monkeypatch):
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    one_host = (
        "hosts:\n  {}:\n    transport: local\n    root: /x\n    files: [a]\n    workspace: w\n"
    )
    (here / "hosts.yaml").write_text(one_host.format("from_cwd"))
    (tmp_path / "env.yaml").write_text(one_host.format("from_env"))
    (tmp_path / "arg.yaml").write_text(one_host.format("from_arg"))
    monkeypatch.delenv("KERNELDEV_CONFIG", raising=False)
    assert load_config().default is None and "from_cwd" in load_config().hosts
    monkeypatch.setenv("KERNELDEV_CONFIG", str(tmp_path / "env.yaml"))
    assert "from_env" in load_config().hosts
    assert "from_arg" in load_config(tmp_path / "arg.yaml").hosts


def test_host_selection(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELDEV_HOST", raising=False)
    config = load_config(write(tmp_path, VALID))
    assert config.host(None).name == "dsv4"  # default
    assert config.host("box").name == "box"  # explicit
    monkeypatch.setenv("KERNELDEV_HOST", "box")
    assert config.host(None).name == "box"  # environment beats default
    assert config.host("dsv4").name == "dsv4"  # explicit beats environment
    with pytest.raises(ConfigError) as caught:
        config.host("nope")
    assert "no host named 'nope'" in caught.value.message
    assert "box, dsv4" in caught.value.message


def test_several_hosts_without_default_need_a_choice(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELDEV_HOST", raising=False)
    config = load_config(write(tmp_path, VALID.replace("default: dsv4\n", "")))
    with pytest.raises(ConfigError, match="several hosts") as caught:
        config.host(None)
    assert "--host" in caught.value.hint


GROUPS = VALID.replace("default: dsv4\n", "default: dsv4\ngroups:\n  fleet: [dsv4, box]\n")


def test_groups_and_comma_lists_name_hosts_in_order(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELDEV_HOST", raising=False)
    config = load_config(write(tmp_path, GROUPS))
    assert config.groups == {"fleet": ("dsv4", "box")}
    names = lambda spec: [h.name for h in config.hosts_for(spec)]  # noqa: E731
    assert names("fleet") == ["dsv4", "box"]
    assert names("box,dsv4") == ["box", "dsv4"]
    assert names("box,fleet") == ["box", "dsv4"]  # each host once, first mention wins
    assert names(None) == ["dsv4"]  # the default
    monkeypatch.setenv("KERNELDEV_HOST", "fleet")
    assert names(None) == ["dsv4", "box"]
    with pytest.raises(ConfigError, match="is a group of hosts"):
        config.host("fleet")  # a one-host command refuses a group by name
    for bad, what in (("dsv4,nope", "no host or group named 'nope'"), ("dsv4,", "empty name")):
        with pytest.raises(ConfigError, match=what):
            config.hosts_for(bad)


@pytest.mark.parametrize(
    "groups, what",
    [
        ("  dsv4: [box]\n", "name of a host"),
        ("  fleet: []\n", "non-empty list"),
        ("  fleet: box\n", "non-empty list"),
        ("  fleet: [box, nope]\n", "names no configured host: 'nope'"),
        ("  fleet: [box, box]\n", "lists 'box' twice"),
    ],
)
def test_bad_groups_name_the_line(tmp_path, groups, what):
    text = VALID.replace("default: dsv4\n", "default: dsv4\ngroups:\n" + groups)
    err = error_for(tmp_path, text)
    assert what in err.message and ":3: groups." in err.message


def test_the_shipped_example_is_valid():
    example = Path(__file__).resolve().parent.parent / "hosts.example.yaml"
    config = load_config(example)
    assert config.host(None).name == config.default


# --- through the CLI --------------------------------------------------------------------


@pytest.mark.parametrize("how", ["option", "env"])
def test_cli_exit_code_2_names_the_bad_key(tmp_path, how):
    path = write(tmp_path, VALID.replace("timeout: 90", "timeout: soon"))
    if how == "option":
        proc = run_cli("--config", str(path), "trust", "--yes")
    else:
        proc = run_cli("trust", "--yes", config=path)
    assert proc.returncode == 2
    assert "hosts.dsv4.service.timeout" in proc.stderr
    assert f"{path}:{line_of(VALID, 'timeout: 90')}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_unknown_host_exit_2(tmp_path):
    path = write(tmp_path, VALID)
    proc = run_cli("trust", "--host", "nope", config=path)
    assert proc.returncode == 2 and "known hosts: box, dsv4" in proc.stderr
