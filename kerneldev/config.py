"""hosts.yaml: where the hosts are, which files to track, how to restart the service.

Lookup order for the file: `--config PATH`, then `$KERNELDEV_CONFIG`, then, like git, the
current folder and each folder above it: `hosts.yaml` there, or a workspace's pointer
`.kerneldev/config.json` (written by `kerneldev pull`) naming its config and host.
Relative local paths in the file (workspace, mirror, identity_file, known_hosts) are resolved
against the file's folder; `~` is expanded. See hosts.example.yaml for every key.

Validation is strict: every problem is a `ConfigError` whose message reads
`<file>:<line>: <key path>: <what is wrong>`, e.g.
`hosts.yaml:12: hosts.dsv4.service.timeout: must be a number > 0, got 'soon'`.
The line numbers come from YAML's node marks, so validation walks the composed node tree
rather than the plain Python objects.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import json
import os
import posixpath
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from kerneldev.errors import ConfigError
from kerneldev.paths import KERNELDEV_DIR as STATE_DIR
from kerneldev.paths import WORKSPACE_POINTER

DEFAULT_CONFIG_NAME = "hosts.yaml"
CONFIG_ENV = "KERNELDEV_CONFIG"
HOST_ENV = "KERNELDEV_HOST"


@dataclass(frozen=True)
class ServiceConfig:
    restart: str | None = None  # shell command run on the host
    health: str | None = None  # http(s):// URL as seen from the host, or a shell command
    timeout: float = 900.0  # seconds to wait for health after a restart
    logs: str | None = None  # shell command whose output is shown when health never comes
    env_file: str | None = None  # absolute path on the host of the KEY=VALUE file restart reads
    check: str | None = None  # import-check command after a push (default: import the modules)
    # decode timings from the running service (bench --service, profile)
    url: str | None = None  # base URL as seen from the host; default: scheme://host:port of health
    variants: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> env assignments


@dataclass(frozen=True)
class SessionConfig:
    """The kept session to a host (`session:`, at the top and per host): whether the first
    command leaves one behind, and when it ends (hosts/transport/session/)."""

    keep: bool = True
    idle: float = 300.0  # seconds without a command before the holder exits
    max_age: float = 600.0  # seconds after which the holder reconnects (re-verifying the key)


@dataclass(frozen=True)
class HostConfig:
    name: str
    root: str  # absolute POSIX path of the live repo root on the host
    files: tuple[str, ...]  # relative to root; shell globs; `path:` entries glob-escaped
    workspace: Path  # absolute local folder
    transport: str = "ssh"  # "ssh" or "local"
    hostname: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: Path | None = None
    known_hosts: Path | None = None
    mirror: Path | None = None
    service: ServiceConfig | None = None
    python: str = "python3"  # interpreter on the host for the bench harness
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for bench on the host
    keep_backups: int = 20  # host backups are pruned to those of the last N deploys
    # Live files' sums reused on the host while their stat is unchanged (hostside/hashfiles.py
    # `LiveSums`); false: every live file is read on every command.
    live_sums: bool = True
    # How a one-shot command reaches an SSH host: "auto" (the system's OpenSSH client where it
    # can do exactly what kerneldev's own connection does, else paramiko), "openssh" or
    # "paramiko" (hosts/transport/one_shot.py).
    ssh_client: str = "auto"
    # Other hosts of this host's groups with the same `workspace`: they share it, each with its
    # own record in its state file (state.py); filled by the loader from `groups:`.
    workspace_peers: tuple[str, ...] = ()
    session: SessionConfig = SessionConfig()
    # The file this entry was read from (None for a host made in code): a kept session watches
    # it and ends when the entry changes.
    config_path: Path | None = field(default=None, compare=False)


class HostChoice(NamedTuple):
    """What `Config.choose` picked: the `--host`-style value, and whether it came from
    $KERNELDEV_HOST (messages about a bad value name the variable)."""

    value: str | None
    from_env: bool


@dataclass(frozen=True)
class Config:
    path: Path
    default: str | None
    hosts: dict[str, HostConfig] = field(default_factory=dict)
    workspace_host: str | None = None  # the host whose workspace pointer led to this file
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> host names

    def choose(self, name: str | None = None) -> HostChoice:
        """The host-selection rule, the one place it is written: `name` (a `--host` value),
        else $KERNELDEV_HOST, else the host of the workspace we are in, else `default`. The
        value may name a host, a group or a comma list; None: nothing chose one (`host` then
        takes the only host)."""
        if name:
            return HostChoice(name, False)
        from_env = os.environ.get(HOST_ENV)
        if from_env:
            return HostChoice(from_env, True)
        return HostChoice(self.workspace_host or self.default, False)

    def host(self, name: str | None = None) -> HostConfig:
        """The named host, else $KERNELDEV_HOST, else the host of the workspace we are in, else
        `default`, else the only host. A group name is refused: use `hosts_for`."""
        chosen, from_env = self.choose(name)
        if chosen is not None and chosen in self.groups:
            raise ConfigError(
                f"'{chosen}' is a group of hosts ({', '.join(self.groups[chosen])}) and this "
                "command works on one host",
                hint="pass --host NAME with one of the group's hosts",
            )
        if chosen is not None and "," in chosen and chosen not in self.hosts:
            where = f" (from ${HOST_ENV})" if from_env else ""
            raise ConfigError(
                f"'{chosen}'{where} is a list of hosts and this command works on one host",
                hint="pass --host NAME with one of them",
            )
        if chosen is None:
            if len(self.hosts) == 1:
                return next(iter(self.hosts.values()))
            raise ConfigError(
                f"{self.path}: several hosts are configured and none is chosen "
                f"(known hosts: {', '.join(sorted(self.hosts))})",
                hint="pass --host NAME, set KERNELDEV_HOST, or add `default: NAME` to the file",
            )
        try:
            return self.hosts[chosen]
        except KeyError:
            where = f" (from ${HOST_ENV})" if from_env else ""
            raise ConfigError(
                f"{self.path}: no host named '{chosen}'{where} "
                f"(known hosts: {', '.join(sorted(self.hosts)) or 'none'})",
                hint=f"fix or unset ${HOST_ENV}, or pass --host NAME"
                if from_env
                else "use one of the known hosts with --host NAME, or add it under `hosts:`",
            ) from None

    def hosts_for(self, spec: str | None = None) -> list[HostConfig]:
        """The hosts a `--host` value names: a host, a group, or a comma list of either (in
        order, each host once). Without a value: $KERNELDEV_HOST (which may also name a group or
        list), else the workspace's host, else `default`, else the only host."""
        chosen, from_env = self.choose(spec)
        if chosen is None:
            return [self.host(None)]
        names = [part.strip() for part in chosen.split(",")]
        if any(not n for n in names):
            raise ConfigError(
                f"--host {chosen!r}: an empty name in the list",
                hint="write names separated by single commas, e.g. --host node0,node1",
            )
        out: list[HostConfig] = []
        for name in names:
            members = self.groups.get(name, (name,))
            for member in members:
                if member not in self.hosts:
                    where = f" (from ${HOST_ENV})" if from_env else ""
                    known = ", ".join(sorted(self.hosts)) or "none"
                    groups = f"; groups: {', '.join(sorted(self.groups))}" if self.groups else ""
                    raise ConfigError(
                        f"{self.path}: no host or group named '{member}'{where} "
                        f"(known hosts: {known}{groups})",
                        hint="use a known host or group with --host NAME[,NAME...]",
                    )
                host = self.hosts[member]
                if host not in out:
                    out.append(host)
        return out


# --- loading ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigLocation:
    path: Path
    found_by: str  # "option", "environment", "search" (hosts.yaml above) or "workspace"
    host: str | None = None  # with "workspace": the host that workspace belongs to


def locate_config(path: Path | str | None = None, cwd: Path | None = None) -> ConfigLocation:
    """The config file to use: `path`, else $KERNELDEV_CONFIG, else the nearest hosts.yaml or
    workspace pointer in the current folder or above it (as git finds `.git`)."""
    if path:
        return ConfigLocation(Path(os.path.expanduser(str(path))), "option")
    env = os.environ.get(CONFIG_ENV)
    if env:
        return ConfigLocation(Path(os.path.expanduser(env)), "environment")
    start = Path(os.path.abspath(cwd or os.getcwd()))
    for folder in (start, *start.parents):
        if (folder / DEFAULT_CONFIG_NAME).is_file():
            return ConfigLocation(folder / DEFAULT_CONFIG_NAME, "search")
        pointer = _read_pointer(folder / WORKSPACE_POINTER)
        if pointer is not None:
            return pointer
    # Not found: name the file the user would create here.
    return ConfigLocation(Path(DEFAULT_CONFIG_NAME), "search")


def _read_pointer(pointer: Path) -> ConfigLocation | None:
    """A workspace's note of its config; ignored when unreadable or when the file moved."""
    try:
        data = json.loads(pointer.read_text(encoding="utf-8"))
        target = Path(data["config"])
        host = data.get("host")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not target.is_file():
        return None
    return ConfigLocation(target, "workspace", host if isinstance(host, str) else None)


def remember_config(workspace: Path, config_path: Path, host_name: str) -> None:
    """Write the workspace's pointer to its config, so kerneldev run inside it finds both."""
    from kerneldev.atomic_file import write_bytes_atomic

    data = {"config": str(Path(os.path.abspath(config_path))), "host": host_name}
    pointer = Path(workspace) / WORKSPACE_POINTER
    try:
        if json.loads(pointer.read_text(encoding="utf-8")) == data:
            return
    except (OSError, ValueError):
        pass
    write_bytes_atomic(pointer, (json.dumps(data, indent=2) + "\n").encode(), mode=0o644)


def find_config(path: Path | str | None = None) -> Path:
    """The config file to use (see `locate_config`)."""
    return locate_config(path).path


def load_config(path: Path | str | None = None) -> Config:
    """Read and validate the config file; raise `ConfigError` naming file, key path and line."""
    location = locate_config(path)
    config_path = location.path
    try:
        text = config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if location.found_by == "search":
            raise ConfigError(
                f"config file not found: no {DEFAULT_CONFIG_NAME} in {os.getcwd()} or any folder "
                "above it, and no kerneldev workspace here",
                hint="pass --config PATH (or set KERNELDEV_CONFIG), run kerneldev from the "
                "folder of your hosts.yaml or inside a pulled workspace, or copy "
                "hosts.example.yaml to hosts.yaml and edit it",
            ) from None
        raise ConfigError(
            f"config file not found: {config_path}",
            hint="check the path given with "
            + ("--config" if location.found_by == "option" else "$KERNELDEV_CONFIG"),
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"config path is a folder, not a file: {config_path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {config_path}: {err}") from None
    config = _Validator(config_path, text).config()
    if location.host in config.hosts:
        config = dataclasses.replace(config, workspace_host=location.host)
    return config


class _Validator:
    """Walks the YAML node tree so every error can name the line it comes from."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.base = Path(os.path.abspath(path)).parent
        self.text = text
        # libyaml's parser for a valid file (~10x faster to compose: every command reads the
        # config), the pure-Python one for every error's message and line.
        self.loader: yaml.SafeLoader | yaml.CSafeLoader | None = None
        self.session_defaults = SessionConfig()  # the top-level `session:`, read first

    # -- helpers --------------------------------------------------------------------------
    def fail(self, node: yaml.Node | None, key_path: str, what: str) -> ConfigError:
        where = str(self.path)
        if node is not None:
            where += f":{node.start_mark.line + 1}"
        prefix = f"{where}: {key_path}: " if key_path else f"{where}: "
        return ConfigError(prefix + what, hint="see hosts.example.yaml for every key")

    def value(self, node: yaml.Node) -> Any:
        assert self.loader is not None
        return self.loader.construct_object(node, deep=True)

    def mapping(self, node: yaml.Node, key_path: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """A mapping node as {key: (key_node, value_node)}; rejects non-string and repeated
        keys (YAML silently keeps the last of two equal keys, which hides typos)."""
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key_path, f"must be a mapping, got {_kind(node)}")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, str):
                raise self.fail(key_node, key_path, f"keys must be strings, got {key!r}")
            if key in out:
                raise self.fail(key_node, _join(key_path, key), "key appears twice")
            out[key] = (key_node, value_node)
        return out

    def check_keys(
        self,
        node: yaml.Node,
        items: dict[str, tuple[yaml.Node, yaml.Node]],
        key_path: str,
        allowed: tuple[str, ...],
        required: tuple[str, ...] = (),
    ) -> None:
        for key, (key_node, _) in items.items():
            if key not in allowed:
                raise self.fail(
                    key_node,
                    _join(key_path, key),
                    f"unknown key (allowed here: {', '.join(allowed)})",
                )
        for key in required:
            if key not in items:
                raise self.fail(node, _join(key_path, key), "required key is missing")

    def string(self, node: yaml.Node, key_path: str, *, allow_empty: bool = False) -> str:
        v = self.value(node)
        if not isinstance(v, str):
            raise self.fail(node, key_path, f"must be a string, got {_describe(v)}")
        if not allow_empty and not v.strip():
            raise self.fail(node, key_path, "must not be empty")
        if "\0" in v:  # a "\0" escape: no path, name or command can hold one
            raise self.fail(node, key_path, f"must not contain a NUL character, got {v!r}")
        return v

    def local_path(self, node: yaml.Node, key_path: str) -> Path:
        raw = os.path.expanduser(self.string(node, key_path))
        return Path(os.path.normpath(os.path.join(self.base, raw)))

    def _compose(self, loader_class):
        """The file's root node, composed by `loader_class` (kept as `self.loader`)."""
        self.loader = loader_class(self.text)
        try:
            return self.loader.get_single_node()
        finally:
            self.loader.dispose()

    # -- schema ---------------------------------------------------------------------------
    def config(self) -> Config:
        fast = getattr(yaml, "CSafeLoader", None)  # libyaml's parser, when PyYAML has it
        if fast is not None:
            try:
                root = self._compose(fast)
                if root is not None:
                    return self._config(root)
            except yaml.YAMLError:
                pass  # reported below by the pure-Python loader, in its words, with its marks
        try:
            root = self._compose(yaml.SafeLoader)
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            line = f":{mark.line + 1}" if mark else ""
            problem = " ".join(p for p in (err.context, err.problem) if p)
            if err.context_mark and mark and err.context_mark.line != mark.line:
                problem += f" (the construct started on line {err.context_mark.line + 1})"
            raise ConfigError(
                f"{self.path}{line}: YAML syntax error: {problem}",
                hint="check indentation and quoting on that line",
            ) from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{self.path}: YAML syntax error: {err}") from None
        if root is None:
            raise ConfigError(
                f"{self.path}: the file is empty",
                hint="copy hosts.example.yaml and edit it",
            )
        try:
            return self._config(root)
        except yaml.YAMLError as err:  # constructor errors, e.g. a bad !!tag
            mark = getattr(err, "problem_mark", None)
            line = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{self.path}{line}: invalid YAML value: {err}") from None

    def _config(self, root: yaml.Node) -> Config:
        items = self.mapping(root, "")
        self.check_keys(root, items, "", ("default", "hosts", "groups", "session"), ("hosts",))
        self.session_defaults = (
            self._session(items["session"][1], "session", SessionConfig())
            if "session" in items
            else SessionConfig()
        )
        hosts_key_node, hosts_node = items["hosts"]
        host_items = self.mapping(hosts_node, "hosts")
        if not host_items:
            raise self.fail(hosts_node, "hosts", "no hosts are defined")
        for name, (key_node, _) in host_items.items():
            # --host takes a comma list: such a name could never be chosen.
            if "," in name or not name.strip():
                raise self.fail(
                    key_node, f"hosts.{name}", "a host name must be non-empty, without commas"
                )
        hosts = {
            name: self._host(name, value_node, f"hosts.{name}")
            for name, (_, value_node) in host_items.items()
        }
        groups = self._groups(items["groups"][1], hosts) if "groups" in items else {}
        hosts = _with_workspace_peers(hosts, groups)
        default = None
        if "default" in items:
            default_node = items["default"][1]
            default = self.string(default_node, "default")
            if default not in hosts and default not in groups:
                raise self.fail(
                    default_node,
                    "default",
                    f"names no configured host or group: '{default}' "
                    f"(known hosts: {', '.join(sorted(hosts))})",
                )
        return Config(
            path=Path(os.path.abspath(self.path)), default=default, hosts=hosts, groups=groups
        )

    def _groups(self, node: yaml.Node, hosts: dict[str, HostConfig]) -> dict[str, tuple[str, ...]]:
        """`groups: {fleet: [node0, node1]}`: each a non-empty list of known host names, named
        unlike any host (so `--host NAME` is never ambiguous)."""
        groups: dict[str, tuple[str, ...]] = {}
        for name, (key_node, value_node) in self.mapping(node, "groups").items():
            kp = f"groups.{name}"
            if name in hosts:
                raise self.fail(key_node, kp, "a group may not have the name of a host")
            if "," in name or not name.strip():
                raise self.fail(key_node, kp, "a group name must be non-empty, without commas")
            if not isinstance(value_node, yaml.SequenceNode) or not value_node.value:
                raise self.fail(value_node, kp, "must be a non-empty list of host names")
            members: list[str] = []
            for item in value_node.value:
                member = self.string(item, kp)
                if member not in hosts:
                    raise self.fail(
                        item,
                        kp,
                        f"names no configured host: '{member}' "
                        f"(known hosts: {', '.join(sorted(hosts))})",
                    )
                if member in members:
                    raise self.fail(item, kp, f"lists '{member}' twice")
                members.append(member)
            groups[name] = tuple(members)
        return groups

    def _host(self, name: str, node: yaml.Node, kp: str) -> HostConfig:
        items = self.mapping(node, kp)
        allowed = (
            "transport",
            "hostname",
            "user",
            "port",
            "identity_file",
            "known_hosts",
            "root",
            "files",
            "workspace",
            "mirror",
            "service",
            "python",
            "gpu",
            "keep_backups",
            "live_sums",
            "ssh_client",
            "session",
        )
        self.check_keys(node, items, kp, allowed, ("root", "files", "workspace"))
        get: Callable[[str], yaml.Node | None] = lambda k: items[k][1] if k in items else None  # noqa: E731

        transport = "ssh"
        if (n := get("transport")) is not None:
            transport = self.string(n, f"{kp}.transport")
            if transport not in ("ssh", "local"):
                raise self.fail(
                    n, f"{kp}.transport", f"must be 'ssh' or 'local', got {transport!r}"
                )
        hostname = None
        if (n := get("hostname")) is not None:
            if transport == "local":
                # A stray hostname usually means `transport: local` was not meant (or was
                # copied); the local transport would silently work on this machine instead.
                raise self.fail(
                    n,
                    f"{kp}.hostname",
                    "not used with `transport: local` (the host is this machine); remove it, "
                    "or use `transport: ssh` to reach that host",
                )
            hostname = self.string(n, f"{kp}.hostname")
        elif transport == "ssh":
            raise self.fail(node, f"{kp}.hostname", "required key is missing (transport is ssh)")
        user = self.string(n, f"{kp}.user") if (n := get("user")) is not None else None
        port = None
        if (n := get("port")) is not None:
            v = self.value(n)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 65536:
                raise self.fail(n, f"{kp}.port", f"must be an integer 1-65535, got {_describe(v)}")
            port = v

        root_node = items["root"][1]
        root = self.string(root_node, f"{kp}.root")
        if not root.startswith("/"):
            raise self.fail(root_node, f"{kp}.root", f"must be an absolute path, got {root!r}")
        root = posixpath.normpath(root)

        service = self._service(n, f"{kp}.service") if (n := get("service")) is not None else None
        python = self.string(n, f"{kp}.python") if (n := get("python")) is not None else "python3"
        gpu = self._gpu(n, f"{kp}.gpu") if (n := get("gpu")) is not None else None
        keep_backups = 20
        if (n := get("keep_backups")) is not None:
            v = self.value(n)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                what = f"must be an integer >= 1, got {_describe(v)}"
                raise self.fail(n, f"{kp}.keep_backups", what)
            keep_backups = v
        live_sums = True
        if (n := get("live_sums")) is not None:
            live_sums = self.value(n)
            if not isinstance(live_sums, bool):
                what = f"must be true or false, got {_describe(live_sums)}"
                raise self.fail(n, f"{kp}.live_sums", what)
        ssh_client = "auto"
        if (n := get("ssh_client")) is not None:
            ssh_client = self.string(n, f"{kp}.ssh_client")
            if ssh_client not in ("auto", "openssh", "paramiko"):
                what = f"must be 'auto', 'openssh' or 'paramiko', got {ssh_client!r}"
                raise self.fail(n, f"{kp}.ssh_client", what)
        return HostConfig(
            name=name,
            root=root,
            files=self._files(items["files"][1], f"{kp}.files"),
            workspace=self.local_path(items["workspace"][1], f"{kp}.workspace"),
            transport=transport,
            hostname=hostname,
            user=user,
            port=port,
            identity_file=self._opt_path(get("identity_file"), f"{kp}.identity_file"),
            known_hosts=self._opt_path(get("known_hosts"), f"{kp}.known_hosts"),
            mirror=self._opt_path(get("mirror"), f"{kp}.mirror"),
            service=service,
            python=python,
            gpu=gpu,
            keep_backups=keep_backups,
            live_sums=live_sums,
            ssh_client=ssh_client,
            session=self._session(n, f"{kp}.session", self.session_defaults)
            if (n := get("session")) is not None
            else self.session_defaults,
            config_path=Path(os.path.abspath(self.path)),
        )

    def _session(self, node: yaml.Node, kp: str, defaults: SessionConfig) -> SessionConfig:
        """`session: {keep: BOOL, idle: SECONDS, max_age: SECONDS}`; a host's keys override
        the top-level ones key by key."""
        items = self.mapping(node, kp)
        self.check_keys(node, items, kp, ("keep", "idle", "max_age"))
        kwargs: dict[str, Any] = {}
        if "keep" in items:
            n = items["keep"][1]
            v = self.value(n)
            if not isinstance(v, bool):
                raise self.fail(n, f"{kp}.keep", f"must be true or false, got {_describe(v)}")
            kwargs["keep"] = v
        for key in ("idle", "max_age"):
            if key in items:
                n = items[key][1]
                v = self.value(n)
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                    what = f"must be a number of seconds > 0, got {_describe(v)}"
                    raise self.fail(n, f"{kp}.{key}", what)
                kwargs[key] = float(v)
        return dataclasses.replace(defaults, **kwargs)

    def _opt_path(self, node: yaml.Node | None, kp: str) -> Path | None:
        return None if node is None else self.local_path(node, kp)

    def _files(self, node: yaml.Node, kp: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, kp, f"must be a list of paths, got {_kind(node)}")
        if not node.value:
            raise self.fail(node, kp, "must list at least one path")
        files: list[str] = []
        for i, item in enumerate(node.value):
            ikp = f"{kp}[{i}]"
            literal = isinstance(item, yaml.MappingNode)
            if literal:
                # `- path: star[1].py`: a literal name, glob characters included.
                items = self.mapping(item, ikp)
                if set(items) != {"path"}:
                    raise self.fail(
                        item,
                        ikp,
                        "must be a string (a path or glob) or `path: NAME` (a literal name), "
                        f"got a mapping with key(s) {', '.join(map(repr, items)) or 'none'}",
                    )
                item = items["path"][1]
                ikp += ".path"
            entry = self.string(item, ikp)
            if entry.startswith("/") or entry.startswith("~"):
                raise self.fail(item, ikp, f"must be relative to root, got {entry!r}")
            if ".." in entry.split("/"):
                raise self.fail(item, ikp, f"must stay inside root (no '..'), got {entry!r}")
            entry = posixpath.normpath(entry)
            if entry == ".":
                raise self.fail(item, ikp, "must name a file, not root itself")
            first = entry.split("/")[0]  # only a pattern with a leading dot matches a dot folder
            if first.startswith(".") and fnmatch.fnmatchcase(STATE_DIR, first):
                raise self.fail(
                    item,
                    ikp,
                    f"must not reach into {STATE_DIR}/, got {entry!r}: that folder holds "
                    "kerneldev's own lock, history and backups (on the host) and state (in the "
                    "workspace)",
                )
            if not literal and "**" in entry:
                raise self.fail(
                    item,
                    ikp,
                    f"'**' is not recursive here, got {entry!r}: globs match like the shell, "
                    "`*` within one folder; list one pattern per folder (a/*.py, a/b/*.py)",
                )
            # Stored as a pattern: a literal name escaped so that it matches only itself.
            files.append(glob.escape(entry) if literal else entry)
        return tuple(files)

    def _service(self, node: yaml.Node, kp: str) -> ServiceConfig:
        items = self.mapping(node, kp)
        allowed = ("restart", "health", "timeout", "logs", "env_file", "check", "url", "variants")
        self.check_keys(node, items, kp, allowed)
        kwargs: dict[str, Any] = {}
        for key in ("restart", "health", "logs", "env_file", "check"):
            if key in items:
                kwargs[key] = self.string(items[key][1], f"{kp}.{key}")
        if "env_file" in kwargs and not kwargs["env_file"].startswith("/"):
            raise self.fail(
                items["env_file"][1],
                f"{kp}.env_file",
                f"must be an absolute path on the host, got {kwargs['env_file']!r}",
            )
        if "url" in items:
            n = items["url"][1]
            url = self.string(n, f"{kp}.url")
            if not url.startswith(("http://", "https://")):
                raise self.fail(n, f"{kp}.url", f"must be an http:// or https:// URL, got {url!r}")
            self._check_url(n, f"{kp}.url", url)
            kwargs["url"] = url.rstrip("/")
        if kwargs.get("health", "").startswith(("http://", "https://")):
            self._check_url(items["health"][1], f"{kp}.health", kwargs["health"])
        if "variants" in items:
            kwargs["variants"] = self._variants(items["variants"][1], f"{kp}.variants")
        if "timeout" in items:
            n = items["timeout"][1]
            v = self.value(n)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise self.fail(n, f"{kp}.timeout", f"must be a number > 0, got {_describe(v)}")
            kwargs["timeout"] = float(v)
        return ServiceConfig(**kwargs)

    def _check_url(self, node: yaml.Node, kp: str, url: str) -> None:
        # A typo here (a port out of range, no host) would only show as a health wait that
        # never ends (900 s by default): say so now.
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is no number 0-65535
        except ValueError as err:
            raise self.fail(node, kp, f"is not a valid URL ({err}), got {url!r}") from None
        if not parts.hostname:
            raise self.fail(node, kp, f"names no host, got {url!r}")

    def _variants(self, node: yaml.Node, kp: str) -> dict[str, dict[str, str]]:
        """name -> {ENV_VAR: value}; numbers are taken as their text (`"0"` and `0` agree)."""
        variants: dict[str, dict[str, str]] = {}
        for name, (key_node, value_node) in self.mapping(node, kp).items():
            vkp = _join(kp, name)
            if not _VARIANT_NAME.fullmatch(name):
                raise self.fail(key_node, vkp, "variant names are letters, digits, '_', '-', '.'")
            env: dict[str, str] = {}
            for var, (var_node, val_node) in self.mapping(value_node, vkp).items():
                if not _ENV_NAME.fullmatch(var):
                    raise self.fail(var_node, _join(vkp, var), "not an environment variable name")
                v = self.value(val_node)
                if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                    raise self.fail(
                        val_node, _join(vkp, var), f"must be a string or number, got {_describe(v)}"
                    )
                if "\n" in str(v):
                    raise self.fail(val_node, _join(vkp, var), "must be one line")
                env[var] = str(v)
            variants[name] = env
        return variants

    def _gpu(self, node: yaml.Node, kp: str) -> str:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise self.fail(node, kp, f"must be a string or an integer, got {_describe(v)}")
        return str(v)


def _with_workspace_peers(
    hosts: dict[str, HostConfig], groups: dict[str, tuple[str, ...]]
) -> dict[str, HostConfig]:
    """Hosts that are in a group together and name the same workspace may share it."""
    out = {}
    for name, host in hosts.items():
        peers = sorted(
            {
                other
                for members in groups.values()
                if name in members
                for other in members
                if other != name and hosts[other].workspace == host.workspace
            }
        )
        out[name] = dataclasses.replace(host, workspace_peers=tuple(peers)) if peers else host
    return out


_VARIANT_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag.endswith(":null"):
        return "nothing (null)"
    return f"{node.value!r}"


def _describe(v: Any) -> str:
    if v is None:
        return "nothing (null)"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return repr(v)
