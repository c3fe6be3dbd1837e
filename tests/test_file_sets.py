"""The file set a host's `files` entries name (kerneldev/loop/workspace.py, config.py): entries that
match nothing, literal names with glob characters, `**`, a `root` that does not exist, and
`transport: local` with a stray `hostname`. Through the real entry point where users meet it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kerneldev.config import load_config
from kerneldev.errors import ConfigError, ExitCode
from kerneldev.loop import drift, workspace
from tests.clirun import run_kerneldev

K = "k/kernel.py"


def make_config(tmp_path: Path, files: list, **host) -> Path:
    root = tmp_path / "live"
    (root / "k").mkdir(parents=True, exist_ok=True)
    (root / K).write_text("V = 1\n")
    entry = {"transport": "local", "root": str(root), "files": files, "workspace": "ws"}
    entry.update(host)
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump({"hosts": {"h": entry}}))
    return config


def kerneldev(config: Path, *args: str) -> subprocess.CompletedProcess:
    return run_kerneldev("--config", str(config), *args, timeout=60)


def test_a_glob_that_matches_nothing_is_an_error_naming_it(tmp_path, isolated_home):
    config = make_config(tmp_path, [K, "k/*.cu"])
    for command in (["pull"], ["diff"], ["push", "--dry-run"]):
        proc = kerneldev(config, *command)
        assert proc.returncode == ExitCode.USAGE, (command, proc.stdout, proc.stderr)
        assert "'k/*.cu' matches no file" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "ws" / K).exists()  # nothing was pulled


def test_a_glob_whose_files_left_the_host_is_missing_live_not_a_config_error(
    tmp_path, isolated_home
):
    config = make_config(tmp_path, ["k/*.py"])
    assert kerneldev(config, "pull").returncode == 0
    (tmp_path / "live" / K).unlink()  # the host changed
    proc = kerneldev(config, "diff", "--json")
    assert proc.returncode == ExitCode.FAILURE, proc.stderr
    assert [(f["path"], f["status"]) for f in json.loads(proc.stdout)["files"]] == [
        (K, drift.MISSING_LIVE)
    ]


def test_diff_never_passes_with_zero_files():
    assert not drift.DriftReport(host="h", mirror_commit=None, files=[]).ok


def test_double_star_is_refused_as_not_recursive(tmp_path, isolated_home):
    config = make_config(tmp_path, ["**/*.py"])
    with pytest.raises(ConfigError, match=r"files\[0\]: '\*\*' is not recursive"):
        load_config(config)
    assert kerneldev(config, "diff").returncode == ExitCode.USAGE


def test_literal_name_with_glob_characters_is_tracked_and_named(tmp_path, isolated_home):
    name = "k/star[1].py"
    config = make_config(tmp_path, [{"path": name}])
    (tmp_path / "live" / name).write_text("LITERAL = 1\n")
    (tmp_path / "live" / "k" / "star1.py").write_text("GLOB = 1  # what the glob would match\n")
    assert load_config(config).host().files == ("k/star[[]1].py",)

    pull = kerneldev(config, "pull", "--json")
    assert pull.returncode == 0, pull.stderr
    assert [f["path"] for f in json.loads(pull.stdout)["files"]] == [name]
    assert (tmp_path / "ws" / name).read_text() == "LITERAL = 1\n"
    assert not (tmp_path / "ws" / "k" / "star1.py").exists()

    (tmp_path / "ws" / name).write_text("EDITED = 1\n")
    for arg in (name, str(tmp_path / "ws" / name)):
        named = kerneldev(config, "diff", "--json", arg)
        assert named.returncode == ExitCode.FAILURE, named.stderr
        assert [(f["path"], f["status"]) for f in json.loads(named.stdout)["files"]] == [
            (name, drift.EDITED)
        ]
    other = kerneldev(config, "diff", "k/star1.py")
    assert other.returncode == ExitCode.USAGE and "configured: k/star[1].py" in other.stderr


def test_a_bracket_name_written_as_a_glob_says_how_to_track_it(tmp_path, isolated_home):
    name = "k/star[1].py"
    config = make_config(tmp_path, [name])
    (tmp_path / "live" / name).write_text("LITERAL = 1\n")
    proc = kerneldev(config, "pull")
    assert proc.returncode == ExitCode.USAGE
    assert f"`- path: {name}`" in proc.stderr


def test_literal_path_and_is_glob():
    assert workspace.literal_path("a/star[[]1].py") == "a/star[1].py"
    assert workspace.literal_path("a/[*]b[?].py") == "a/*b?.py"
    assert workspace.literal_path("a/b.py") == "a/b.py"
    assert workspace.literal_path("a/*.py") is None and workspace.is_glob("a/[ab].py")
    assert workspace.path_matches("a/star[1].py", workspace.glob_escape("a/star[1].py"))


def test_paths_in_a_workspace_reached_through_a_symlink(tmp_path, monkeypatch):
    """The configured workspace is a symlink (or the user's path goes through one): a path
    relative to the current folder (which the OS reports as the real one) or through the
    other name still names the workspace file."""
    real = tmp_path / "disk" / "ws"
    (real / "k").mkdir(parents=True)
    (real / K).write_text("V = 1\n")
    (tmp_path / "ws").symlink_to(real)
    host = load_config(make_config(tmp_path, [K])).host("h")
    monkeypatch.chdir(tmp_path / "ws" / "k")
    assert workspace.resolve_paths(host, ["kernel.py", str(real / K)]) == [K]
    other = load_config(make_config(tmp_path, [K], workspace=str(real))).host("h")
    assert workspace.resolve_paths(other, [str(tmp_path / "ws" / K)]) == [K]
    with pytest.raises(workspace.UsageError):
        workspace.resolve_paths(host, [str(tmp_path / "disk" / "other.py")])


def test_push_into_a_root_that_does_not_exist_is_refused(tmp_path, isolated_home):
    config = make_config(tmp_path, [K])
    assert kerneldev(config, "pull").returncode == 0
    typo = tmp_path / "lvie" / "sglang"
    data = yaml.safe_load(config.read_text())
    data["hosts"]["h"]["root"] = str(typo)
    data["hosts"]["h"]["workspace"] = "ws2"  # a fresh workspace with a copy of the file
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "ws2" / "k").mkdir(parents=True)
    (tmp_path / "ws2" / K).write_text("V = 2\n")

    proc = kerneldev(config, "push")
    assert proc.returncode == ExitCode.FAILURE
    assert f"the root {typo} does not exist" in proc.stderr and "--create-root" in proc.stderr
    assert not (tmp_path / "lvie").exists()

    created = kerneldev(config, "push", "--create-root")
    assert created.returncode == 0, created.stderr
    assert (typo / K).read_text() == "V = 2\n"


def test_pull_from_a_root_that_does_not_exist_names_the_root(tmp_path, isolated_home):
    for files in (["k/*.py"], [K]):
        config = make_config(tmp_path, files, root=str(tmp_path / "nowhere"))
        proc = kerneldev(config, "pull")
        assert proc.returncode == ExitCode.USAGE, files
        assert f"the root {tmp_path / 'nowhere'} does not exist" in proc.stderr


def test_local_transport_with_a_hostname_is_a_config_error(tmp_path, isolated_home):
    config = make_config(tmp_path, [K], hostname="gpu-box")
    with pytest.raises(ConfigError, match=r"hosts\.h\.hostname: not used with `transport: local`"):
        load_config(config)
