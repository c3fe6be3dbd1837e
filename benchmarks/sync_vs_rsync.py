#!/usr/bin/env python3
"""kerneldev pull / push / diff timed side by side with `rsync -a -e ssh` and `scp`.

Starts its own OpenSSH sshd on 127.0.0.1 with fresh keys (kerneldev.sandbox.host's starter), and a
temporary HOME whose ~/.ssh/config (given to OpenSSH with -F) names that server `kbench`, so
rsync, scp, ssh and kerneldev (`hostname: kbench` in a temporary hosts.yaml) all reach the
same server the way a user's tools would. Every tool gets its own folder on the "host" and locally.

Cases: 1, 20 and 100 files of 13 KB, and one 50 MB file, and 1 and 20 files with 50 ms more
round trip (`-rtt50`: through `DelayProxy`, as the machine has no netem); operations: pull
cold (nothing in the workspace), pull no-op, push cold (every file changed), push no-op, diff
no-op (rsync's reference is a dry run, plain and with --checksum). Runs are interleaved: in
each run every case and operation is timed for every tool, in an order rotated per run, so a
load change on the machine hits all tools alike. kerneldev runs as its console script in a
subprocess, as a user runs it; push uses `--no-import-check` (the import check is a separate
feature that imports the pushed modules on the host; rsync has nothing like it).

The `floor` tool is one SSH session + the host's Python start-up (+ the bytes for the cold
operations): `ssh kbench python3 -c ...`. Fixed costs are measured the same way: `python -c
pass`, `kerneldev --help`, `python -c "import paramiko"`, a bare paramiko connect +
authenticate + `true`, `ssh kbench true`, plus a `-X importtime` summary of `kerneldev diff`.

    python benchmarks/sync_vs_rsync.py [--runs 5] [--out docs/results/sync-vs-rsync.json]

Not part of the test suite: times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import queue
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kerneldev.sandbox.host import start_sshd
from kerneldev.sandbox.proxy import LoopbackProxy

SMALL = 13 * 1024
BIG = 50 * 1000 * 1000
# name -> number of small files (0: the big one). A name ending in RTT_SUFFIX reaches the
# server through DelayProxy: 50 ms more round trip (real GPU boxes are 20-150 ms away).
CASES = {"1": 1, "20": 20, "100": 100, "50MB": 0, "1-rtt50": 1, "20-rtt50": 20}
RTT_SUFFIX = "-rtt50"
ONE_WAY_DELAY = 0.025  # seconds each way: 50 ms of round trip
OPS = ("pull_cold", "pull_noop", "push_cold", "push_noop", "diff_noop")
# Which tools are timed for each operation: add a tool here and in `Bench.command` (and a
# folder in `Bench.own` if it keeps its own files) to time another variant.
# "floor": one SSH session + the host's Python start-up (+ the bytes, for a cold pull or
# push): what any tool that runs a helper on the host pays at least.
TOOLS = {
    "pull_cold": ("kerneldev", "rsync", "scp", "floor"),
    "pull_noop": ("kerneldev", "rsync", "floor"),
    "push_cold": ("kerneldev", "rsync", "scp", "floor"),
    "push_noop": ("kerneldev", "rsync", "floor"),
    "diff_noop": ("kerneldev", "rsync", "rsync-c", "floor"),
}
# "kerneldev-kept": kerneldev through a live kept session (docs/sessions.md), started by the
# untimed warm-up pull; "kerneldev-warm": one-shot (`--no-keep`: its own SSH connection) but
# handed to the live warm process (docs/sessions.md), which that pull started too;
# "kerneldev" itself runs one-shot and fully cold (KERNELDEV_NO_KEEP=1, KERNELDEV_WARM=0).
TOOLS = {
    op: (*tools[:1], "kerneldev-kept", "kerneldev-warm", *tools[1:]) for op, tools in TOOLS.items()
}
# With --base: the other tree one-shot and cold, and through its own kept session.
BASE_TOOLS = ("kerneldev-base", "kerneldev-kept-base")
KEPT_TOOLS = ("kerneldev-kept", "kerneldev-kept-base")
# The floor's host-side programs: read every file of a folder to stdout, or read stdin.
_FLOOR_READ = (
    "import sys,os; o=sys.stdout.buffer; d=sys.argv[1]; "
    "[o.write(open(os.path.join(d,n),'rb').read()) for n in sorted(os.listdir(d))]"
)
_FLOOR_WRITE = "import sys; sys.stdin.buffer.read()"

_PARAMIKO_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
import paramiko
t1 = time.perf_counter()
key = paramiko.Ed25519Key.from_private_key_file(sys.argv[3])
c = paramiko.SSHClient()
c.load_host_keys(sys.argv[4])
c.connect("127.0.0.1", port=int(sys.argv[1]), username=sys.argv[2], pkey=key,
          allow_agent=False, look_for_keys=False)
t2 = time.perf_counter()
_, out, _ = c.exec_command("true")
out.channel.recv_exit_status()
t3 = time.perf_counter()
c.close()
print(json.dumps({"import": t1 - t0, "connect_auth": t2 - t1, "exec_true": t3 - t2}))
"""


class DelayProxy(LoopbackProxy):
    """A TCP proxy on 127.0.0.1 that delivers every chunk ONE_WAY_DELAY later, both ways.

    Stands in for `tc qdisc ... netem delay` in a network namespace, which this benchmark's
    machine may not have (no sch_netem): latency only, no bandwidth limit or loss."""

    def _forward(self, client: socket.socket, server: socket.socket) -> None:
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for src, dst in ((client, server), (server, client)):
            pending: queue.Queue = queue.Queue()
            threading.Thread(target=self._read, args=(src, pending), daemon=True).start()
            threading.Thread(target=self._deliver, args=(dst, pending), daemon=True).start()

    @staticmethod
    def _read(src: socket.socket, pending: queue.Queue) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            pending.put((time.monotonic() + ONE_WAY_DELAY, data))
            if not data:
                return

    @staticmethod
    def _deliver(dst: socket.socket, pending: queue.Queue) -> None:
        while True:
            due, data = pending.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return


class Bench:
    def __init__(self, tmp: Path, kerneldev: str, base: Path | None = None) -> None:
        self.tmp = tmp
        self.kerneldev = kerneldev
        # another kerneldev, timed as the tools "kerneldev-base" (one-shot, cold) and
        # "kerneldev-kept-base" (through its own kept session and warm process): a source tree
        # run by this console script through PYTHONPATH, or another install's console script
        self.base = base
        self.base_script = str(base) if base and base.is_file() else kerneldev
        self.base_env = {"PYTHONPATH": str(base)} if base and not base.is_file() else {}
        self.own = ("kerneldev", "rsync", "scp", "kerneldev-kept", "kerneldev-warm")
        self.own += BASE_TOOLS if base else ()
        self.server = start_sshd(tmp / "sshd")
        self.proxy = DelayProxy(self.server.port)
        self.home = tmp / "home"
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True)
        key = self.server.host_key_line.split(" ", 1)[1]
        (ssh_dir / "known_hosts").write_text(
            self.server.host_key_line + f"[127.0.0.1]:{self.proxy.port} {key}"
        )
        (ssh_dir / "config").write_text(
            "".join(
                f"Host {alias}\n"
                "  HostName 127.0.0.1\n"
                f"  Port {port}\n"
                f"  User {self.server.user}\n"
                f"  IdentityFile {self.server.client_key}\n"
                "  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {ssh_dir / 'known_hosts'}\n"
                "  StrictHostKeyChecking yes\n"
                "  BatchMode yes\n"
                for alias, port in (("kbench", self.server.port), ("kbench-rtt", self.proxy.port))
            )
        )
        os.chmod(ssh_dir / "config", 0o600)
        # OpenSSH finds ~ in the passwd entry, not $HOME: rsync, scp and ssh get -F; kerneldev
        # reads the same file as ~/.ssh/config through $HOME.
        self.ssh_config = ssh_dir / "config"
        self.config = tmp / "hosts.yaml"
        env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "KERNELDEV_HOST")}
        env.update(HOME=str(self.home), KERNELDEV_CONFIG=str(self.config))
        env.pop("KERNELDEV_SSH_CONFIG", None)
        # Compiled modules cached as a user's installed package has them (a shell that sets
        # PYTHONDONTWRITEBYTECODE would compile every module of every run), kept out of the
        # source trees.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        # The kept tool's hosts have a config of their own: their sessions outlive the run
        # (an older kerneldev timed as kerneldev-base would refuse the `session` key).
        self.kept_config = tmp / "hosts-kept.yaml"
        self.kept_env = {**env, "KERNELDEV_CONFIG": str(self.kept_config)}
        self.warm_env = dict(env)
        env["KERNELDEV_NO_KEEP"] = "1"
        env["KERNELDEV_WARM"] = "0"
        self.env = env
        self.generation = 0
        hosts = []
        kept_hosts = []
        for case, n in CASES.items():
            for tool in self.own:
                self.remote(case, tool).mkdir(parents=True)
                self.local(case, tool).mkdir(parents=True)
            self.write_files(self.remote(case, "kerneldev"), case)
            for tool in self.own[1:]:
                _copy_tree(self.remote(case, "kerneldev"), self.remote(case, tool))
            files = '["*.py"]' if n else '["big.bin"]'
            for tool, name in (
                ("kerneldev", f"c{case}"),
                ("kerneldev-base", f"b{case}"),
                ("kerneldev-kept", f"k{case}"),
                ("kerneldev-kept-base", f"kb{case}"),
                ("kerneldev-warm", f"w{case}"),
            ):
                if tool in self.own:
                    (kept_hosts if tool in KEPT_TOOLS else hosts).append(
                        f"  {name}:\n    hostname: {_alias(case)}\n"
                        f"    root: {self.remote(case, tool)}\n"
                        f"    workspace: {self.local(case, tool)}\n    files: {files}\n"
                    )
        self.config.write_text("hosts:\n" + "".join(hosts))
        self.kept_config.write_text("session: {idle: 3600}\nhosts:\n" + "".join(kept_hosts))

    def remote(self, case: str, tool: str) -> Path:
        return self.tmp / "host" / case / tool

    def local(self, case: str, tool: str) -> Path:
        return self.tmp / "local" / case / tool

    def write_files(self, folder: Path, case: str) -> None:
        """New content for every file of the case (same sizes), with a fresh mtime."""
        self.generation += 1
        n = CASES[case]
        stamp = time.time() + self.generation  # rsync compares whole seconds
        if n == 0:
            data = os.urandom(BIG)
            (folder / "big.bin").write_bytes(data)
            os.utime(folder / "big.bin", (stamp, stamp))
            return
        for i in range(n):
            line = f"# generation {self.generation} file {i} " + "x" * 60 + "\n"
            body = (line * (SMALL // len(line) + 1))[:SMALL]
            path = folder / f"k_{i:03d}.py"
            path.write_text(body)
            os.utime(path, (stamp, stamp))

    # --- one timed command per tool and operation ----------------------------------------
    def prepare(self, case: str, op: str, tool: str) -> None:
        if tool == "floor":
            return  # it reads rsync's folders and keeps nothing
        local = self.local(case, "rsync" if tool == "rsync-c" else tool)
        if op == "pull_cold" and tool in KEPT_TOOLS:
            # Everything but the kept session's socket folder, which lives in the workspace
            # when $XDG_RUNTIME_DIR is unusable: removing it retires the holder (by design),
            # so the kept column would time a new session, not a cold pull through one.
            _empty_except(local, local / ".kerneldev" / "sessions")
        elif op == "pull_cold":
            shutil.rmtree(local)
            local.mkdir()
        elif op == "push_cold":
            self.write_files(local, case)

    def command(self, case: str, op: str, tool: str) -> list[str]:
        local = self.local(case, "rsync" if tool == "rsync-c" else tool)
        remote = f"{_alias(case)}:" + str(self.remote(case, "rsync" if tool == "rsync-c" else tool))
        verb = op.split("_")[0]
        ssh = f"ssh -F {self.ssh_config}"
        if tool in ("kerneldev", "kerneldev-warm", *KEPT_TOOLS, *BASE_TOOLS):
            extra = ["--no-import-check"] if verb == "push" else []
            extra += ["--no-keep"] if tool == "kerneldev-warm" else []
            letter = {"kerneldev": "c", "kerneldev-base": "b", "kerneldev-kept": "k"}
            letter["kerneldev-kept-base"] = "kb"
            name = {**letter, "kerneldev-warm": "w"}[tool] + case
            script = self.base_script if tool in BASE_TOOLS else self.kerneldev
            return [script, verb, "--host", name, *extra]
        if tool in ("rsync", "rsync-c"):
            flags = ["-a"] + (["-n"] if verb == "diff" else [])
            flags += ["-c"] if tool == "rsync-c" else []
            if verb == "pull":
                return ["rsync", *flags, "-e", ssh, remote + "/", str(local) + "/"]
            return ["rsync", *flags, "-e", ssh, str(local) + "/", remote + "/"]
        if tool == "floor":
            ssh_argv = ["ssh", "-F", str(self.ssh_config), _alias(case)]
            folder = shlex.quote(str(self.remote(case, "rsync")))
            if op == "pull_cold":
                return [*ssh_argv, f"python3 -c {shlex.quote(_FLOOR_READ)} {folder}"]
            if op == "push_cold":
                return [*ssh_argv, f"python3 -c {shlex.quote(_FLOOR_WRITE)}"]
            return [*ssh_argv, "python3 -c pass"]
        if tool == "scp":
            scp = ["scp", "-F", str(self.ssh_config), "-q", "-p"]
            if verb == "pull":
                return [*scp, remote + "/*", str(local) + "/"]
            return [*scp, *sorted(str(p) for p in local.iterdir()), remote + "/"]
        raise ValueError(tool)

    def stdin_for(self, case: str, op: str, tool: str) -> bytes | None:
        """The bytes the floor sends for a cold push: every file of the case."""
        if tool != "floor" or op != "push_cold":
            return None
        folder = self.local(case, "rsync")
        return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file())

    def time_command(self, argv: list[str], tool: str = "", stdin: bytes | None = None) -> float:
        env = self.env
        if tool == "kerneldev-base":
            env = {**env, **self.base_env}
        if tool == "kerneldev-kept":
            env = self.kept_env
        if tool == "kerneldev-kept-base":
            env = {**self.kept_env, **self.base_env}
        if tool == "kerneldev-warm":
            env = self.warm_env
        feed = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, **feed)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(
                f"{' '.join(argv)} exited {proc.returncode}:\n"
                f"{proc.stdout.decode(errors='replace')}{proc.stderr.decode(errors='replace')}"
            )
        return took

    def check_same(self, cases: list[str]) -> list[str]:
        """Every tool's local folder holds exactly its host folder's bytes."""
        problems = []
        for case in cases:
            for tool in self.own:
                a, b = _tree(self.local(case, tool)), _tree(self.remote(case, tool))
                if a != b:
                    problems.append(f"{case}/{tool}: local and host differ")
        return problems

    def close(self) -> None:
        stop = [self.kerneldev, "session", "stop", "--all"]
        subprocess.run(stop, env=self.kept_env, capture_output=True)
        if self.base:
            base_env = {**self.kept_env, **self.base_env}
            subprocess.run([self.base_script, *stop[1:]], env=base_env, capture_output=True)
        self.proxy.close()
        self.server.stop()


def _wait_for_warm(bench: Bench, timeout: float = 60.0) -> None:
    """Until the warm processes the warm-up's kept pulls started listen (its imports take a
    while; one per kerneldev tree), so no timed sample of the warm or kept tools is a
    fallback that runs cold."""
    from kerneldev.cli import warm_client

    # Each tree's own socket (another checkout's warm process may listen in the same folder).
    ask = "from kerneldev.cli import warm_client; print(warm_client.socket_path())"
    runs = [(bench.kerneldev, bench.kept_env)] + (
        [(bench.base_script, {**bench.kept_env, **bench.base_env})] if bench.base else []
    )
    paths = [
        subprocess.run(
            [_interpreter(script), "-c", ask],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd="/",  # not this checkout's folder, whose kerneldev `-c` would import first
        ).stdout.strip()
        for script, env in runs
    ]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(warm_client.listening(path) for path in paths):
            return
        time.sleep(0.5)
    print("no warm process listens: kerneldev-warm runs cold", file=sys.stderr)


def _interpreter(script: str) -> str:
    """The Python a console script runs under (its #! line), else this one."""
    with open(script, "rb") as f:
        first = f.readline()
    return first[2:].decode().split()[0] if first.startswith(b"#!") else sys.executable


def _alias(case: str) -> str:
    """The ssh_config name that reaches the server for `case` (through the proxy or not)."""
    return "kbench-rtt" if case.endswith(RTT_SUFFIX) else "kbench"


def _copy_tree(src: Path, dst: Path) -> None:
    for p in src.iterdir():
        shutil.copy2(p, dst / p.name)


def _empty_except(folder: Path, keep: Path) -> None:
    """Remove everything under `folder` but `keep` (and the folders that lead to it)."""
    for p in folder.iterdir():
        if p == keep:
            continue
        if p.is_dir() and not p.is_symlink() and keep.is_relative_to(p):
            _empty_except(p, keep)
        elif p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _tree(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".")
    }


def _stats(samples: list[float]) -> dict:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def fixed_costs(bench: Bench, runs: int) -> dict:
    py = sys.executable
    mux = ["ssh", "-F", str(bench.ssh_config), "-o", "ControlMaster=auto", "-o"]
    mux += [f"ControlPath={bench.tmp}/cm-%C", "-o", "ControlPersist=300"]
    probe_args = [
        str(bench.server.port),
        bench.server.user,
        str(bench.server.client_key),
        str(bench.home / ".ssh" / "known_hosts"),
    ]
    commands = {
        "python -c pass": [py, "-c", "pass"],
        "kerneldev --help": [bench.kerneldev, "--help"],
        "python -c 'import paramiko'": [py, "-c", "import paramiko"],
        "paramiko connect+auth+true (process)": [py, "-c", _PARAMIKO_PROBE, *probe_args],
        "ssh kbench true": ["ssh", "-F", str(bench.ssh_config), "kbench", "true"],
        # What reusing an authenticated connection (OpenSSH ControlMaster) would leave.
        "ssh kbench true (ControlMaster, warm)": [*mux, "kbench", "true"],
    }
    bench.time_command([*mux, "kbench", "true"])  # starts the master
    samples: dict[str, list[float]] = {k: [] for k in commands}
    inside: list[dict] = []
    for r in range(runs):
        names = list(commands)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            if name.startswith("paramiko"):
                start = time.perf_counter()
                out = subprocess.run(
                    commands[name], env=bench.env, capture_output=True, check=True, text=True
                )
                samples[name].append(time.perf_counter() - start)
                inside.append(json.loads(out.stdout))
            else:
                samples[name].append(bench.time_command(commands[name]))
    subprocess.run([*mux, "-O", "exit", "kbench"], env=bench.env, capture_output=True)
    result = {k: _stats(v) for k, v in samples.items()}
    result["paramiko inside the process"] = {
        k: statistics.median(d[k] for d in inside) for k in inside[0]
    }
    result["importtime"] = {
        "kerneldev --help": importtime(bench, ["--help"]),
        "kerneldev diff": importtime(bench, ["diff", "--host", "c1"]),
        "kerneldev diff, kept": importtime(bench, ["diff", "--host", "k1"], bench.kept_env),
    }
    return result


def importtime(bench: Bench, args: list[str], env: dict | None = None) -> dict:
    """-X importtime of one kerneldev command: total and the top-level packages by time."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kerneldev", *args],
        env=env or bench.env,
        capture_output=True,
        text=True,
    )
    per_package: dict[str, int] = {}
    total = 0
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = (x.strip() for x in line[len("import time:") :].split("|"))
        top = name.strip().split(".")[0]
        per_package[top] = per_package.get(top, 0) + int(self_us)
        total += int(self_us)
    top = sorted(per_package.items(), key=lambda kv: -kv[1])[:10]
    return {"total_ms": total / 1000, "top_ms": {k: v / 1000 for k, v in top}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES), help="comma list of " + ",".join(CASES))
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--out", default=None, help="JSON results (default: docs/results/...)")
    parser.add_argument("--label", default="", help="a name for this run, kept in the JSON")
    parser.add_argument(
        "--kerneldev",
        default=str(Path(sys.executable).with_name("kerneldev")),
        help="the kerneldev console script to time",
    )
    parser.add_argument("--no-fixed", action="store_true", help="skip the fixed-cost part")
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="another kerneldev, timed interleaved as the tool kerneldev-base: a folder holding "
        "its package (e.g. `git archive main kerneldev`), run through PYTHONPATH, or the "
        "console script of another install (another venv)",
    )
    args = parser.parse_args()
    if args.base is not None and not args.base.exists():
        parser.error(f"--base {args.base}: no such file or folder")
    cases = [c for c in args.cases.split(",") if c]
    ops = [o for o in args.ops.split(",") if o]

    # SIGTERM unwinds like Ctrl-C, so the sshd started below is stopped and its folder removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="kerneldev-bench-"))
    bench = Bench(tmp, args.kerneldev, args.base)
    times: dict[tuple[str, str, str], list[float]] = {}
    try:
        # One untimed pull, so every tool starts from the same local state (and the push
        # cases have a workspace whose state knows the files).
        for case in cases:
            for tool in bench.own:
                bench.time_command(bench.command(case, "pull_cold", tool), tool)
        _wait_for_warm(bench)
        for r in range(args.runs):
            for case in cases:
                for op in ops:
                    tools = list(TOOLS[op]) + (list(BASE_TOOLS) if args.base else [])
                    tools = tools[r % len(tools) :] + tools[: r % len(tools)]
                    for tool in tools:
                        bench.prepare(case, op, tool)
                        stdin = bench.stdin_for(case, op, tool)
                        took = bench.time_command(bench.command(case, op, tool), tool, stdin)
                        times.setdefault((case, op, tool), []).append(took)
            print(f"run {r + 1}/{args.runs} done", file=sys.stderr)
        problems = bench.check_same(cases)
        print("timing the fixed costs", file=sys.stderr)
        try:
            fixed = None if args.no_fixed else fixed_costs(bench, args.runs)
        except Exception as err:  # noqa: BLE001 - keep the timings already made
            print(f"fixed costs failed: {err!r}", file=sys.stderr)
            fixed = None
    finally:
        bench.close()
        shutil.rmtree(tmp, ignore_errors=True)

    rows = []
    for case in cases:
        for op in ops:
            entry = {"case": case, "op": op}
            for tool in TOOLS[op] + (BASE_TOOLS if args.base else ()):
                entry[tool] = _stats(times[(case, op, tool)])
            entry["ratio_vs_rsync"] = entry["kerneldev"]["median"] / entry["rsync"]["median"]
            if "floor" in entry:
                entry["ratio_vs_floor"] = entry["kerneldev"]["median"] / entry["floor"]["median"]
            if "kerneldev-kept" in entry:
                kept = entry["kerneldev-kept"]["median"]
                entry["kept_ratio_vs_rsync"] = kept / entry["rsync"]["median"]
            if "kerneldev-warm" in entry:
                warm = entry["kerneldev-warm"]["median"]
                entry["warm_ratio_vs_rsync"] = warm / entry["rsync"]["median"]
                entry["warm_ratio_vs_floor"] = warm / entry["floor"]["median"]
            if args.base:
                base = entry["kerneldev-base"]["median"]
                entry["base_ratio_vs_rsync"] = base / entry["rsync"]["median"]
                entry["base_ratio_vs_floor"] = base / entry["floor"]["median"]
                kept = entry["kerneldev-kept-base"]["median"]
                entry["kept_base_ratio_vs_rsync"] = kept / entry["rsync"]["median"]
            rows.append(entry)
    result = {
        "label": args.label,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
            "python": sys.version.split()[0],
            "rsync": _first_line(["rsync", "--version"]),
            "ssh": _first_line(["ssh", "-V"]),
            "paramiko": _module_version("paramiko"),
            "kerneldev_commit": _first_line(["git", "rev-parse", "--short", "HEAD"]),
        },
        "runs": args.runs,
        "command": " ".join(["python", *sys.argv]),
        "rows": rows,
        "fixed_costs": fixed,
        "problems": problems,
    }
    out = Path(args.out) if args.out else _default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    print(f"\nfull results: {out}")
    return 1 if problems else 0


def render(result: dict) -> str:
    has_base = any("kerneldev-base" in row for row in result["rows"])
    lines = [
        f"{'case':>5} {'operation':<10} {'kerneldev':>18} {'rsync':>18} {'other':>24} {'ratio':>6}"
        + (f" {'base':>18} {'base ratio':>10}" if has_base else "")
    ]

    def cell(s: dict) -> str:
        return f"{s['median']:.3f} ({s['min']:.2f}-{s['max']:.2f})"

    for row in result["rows"]:
        other = ""
        for tool in ("scp", "rsync-c"):
            if tool in row:
                other = f"{tool} {cell(row[tool])}"
        floor = (
            f" floor {cell(row['floor'])} ({row['ratio_vs_floor']:.2f}x)" if "floor" in row else ""
        )
        lines.append(
            f"{row['case']:>5} {row['op']:<10} {cell(row['kerneldev']):>18} "
            f"{cell(row['rsync']):>18} {other:>24} {row['ratio_vs_rsync']:>6.2f}"
            + (
                f" {cell(row['kerneldev-base']):>18} {row['base_ratio_vs_rsync']:>10.2f}"
                if has_base
                else ""
            )
            + floor
            + (
                f" kept {cell(row['kerneldev-kept'])} ({row['kept_ratio_vs_rsync']:.2f}x)"
                if "kerneldev-kept" in row
                else ""
            )
            + (
                f" kept-base {cell(row['kerneldev-kept-base'])} "
                f"({row['kept_base_ratio_vs_rsync']:.2f}x)"
                if "kerneldev-kept-base" in row
                else ""
            )
            + (
                f" warm one-shot {cell(row['kerneldev-warm'])} "
                f"({row['warm_ratio_vs_rsync']:.2f}x rsync, "
                f"{row['warm_ratio_vs_floor']:.2f}x floor)"
                if "kerneldev-warm" in row
                else ""
            )
        )
    fixed = result.get("fixed_costs")
    if fixed:
        lines.append("\nfixed costs (median, s):")
        for name, s in fixed.items():
            if isinstance(s, dict) and "median" in s:
                lines.append(f"  {name:<40} {s['median']:.3f}")
        inside = fixed["paramiko inside the process"]
        lines.append("  paramiko inside: " + ", ".join(f"{k} {v:.3f}" for k, v in inside.items()))
        for name, it in fixed["importtime"].items():
            top = ", ".join(f"{k} {v:.0f}" for k, v in list(it["top_ms"].items())[:6])
            lines.append(f"  importtime {name}: {it['total_ms']:.0f} ms ({top})")
    if result["problems"]:
        lines.append("PROBLEMS: " + "; ".join(result["problems"]))
    return "\n".join(lines)


def _first_line(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True)
    except OSError:
        return "?"
    return (proc.stdout or proc.stderr).strip().splitlines()[0]


def _module_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - informational only
        return "?"


def _default_out() -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H%M")
    results = Path(__file__).resolve().parent.parent / "docs" / "results"
    return results / f"sync-vs-rsync-{stamp}.json"


if __name__ == "__main__":
    sys.exit(main())
