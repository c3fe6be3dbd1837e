"""One writer at a time on a host: `<root>/.kerneldev/lock`.

push, rollback and restart hold this lock for their whole run (plan, uploads, record, restart),
so two engineers never interleave. The lock file is created atomically by the host's shell
(`set -C`, an O_EXCL create) and holds one JSON line naming the holder: user, machine, pid,
command, since when, and a random token that only the holder's release may remove.

A second command waits up to `wait` seconds, saying who holds the lock, then fails with
`LockBusyError` naming the holder. A lock whose holder ran on this machine and whose process is
gone (a killed or crashed kerneldev, a cut connection) is stale: it is taken over with a note.
A holder on another machine cannot be checked from here; `break_lock` (`--break-lock`) removes
whatever lock is there, after the user has made sure its holder is gone.

A push takes the lock in its first remote command, the scan (`scan_request` / `took`), and, when
its caller allows, drops it in its last (`release_command` / `released_on_host`): one login on
the host instead of three. A lock found busy falls back to `acquire` (the wait, stale detection,
`--break-lock`).
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import secrets
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from kerneldev import interrupt
from kerneldev.errors import LockBusyError as LockBusyError  # re-exported: it was defined here
from kerneldev.errors import RefusedError, TransferError
from kerneldev.hosts.transport.base import Transport
from kerneldev.local_user import local_user
from kerneldev.loop.state import now_iso
from kerneldev.paths import HOST_HISTORY, HOST_LOCK, KERNELDEV_DIR

LOCK_FILE = HOST_LOCK  # under the host's root
DEFAULT_WAIT = 60.0  # seconds a command waits for another's lock
POLL = 0.25  # seconds between attempts

_held_tokens: set[str] = set()  # locks this process holds now (for `is_stale`)
_held_locks: list[HostLock] = []  # the same locks, for `holding`


@dataclass(frozen=True)
class LockHolder:
    user: str
    machine: str
    pid: int
    command: str
    since: str
    token: str

    def describe(self) -> str:
        return f"{self.user}@{self.machine} (pid {self.pid}, `{self.command}`) since {self.since}"


def wait_text(seconds: float) -> str:
    """How long a command waits for the lock, for its message: "up to 60s", or "as long as
    it takes" for an infinite wait (`--lock-wait inf`)."""
    return "as long as it takes" if math.isinf(seconds) else f"up to {seconds:g}s"


def lock_path(root: str) -> str:
    return posixpath.join(root, LOCK_FILE)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def is_stale(holder: LockHolder) -> bool:
    """True when the holder ran on this machine and its process is gone, or is this very
    process but no longer holds it (its connection was cut before it could release)."""
    if holder.machine != socket.gethostname():
        return False
    if holder.pid == os.getpid():
        return holder.token not in _held_tokens
    return not process_alive(holder.pid)


def holding(transport: Transport, root: str) -> HostLock | None:
    """The lock this process holds on `root` through `transport` (taken by a caller before it
    calls `sync.push`), so that the push's steps can check on the host that it is still theirs."""
    for lock in reversed(_held_locks):
        if lock.transport is transport and lock.root == root and lock.held:
            return lock
    return None


def parse_holder(text: str) -> LockHolder | None:
    try:
        raw = json.loads(text)
        return LockHolder(
            user=str(raw["user"]),
            machine=str(raw["machine"]),
            pid=int(raw["pid"]),
            command=str(raw["command"]),
            since=str(raw["since"]),
            token=str(raw["token"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


class HostLock:
    """Context manager: acquire on enter, release on exit (also after Ctrl-C or an error).

    `notes` collects what the user should hear (a stale lock taken over, a lock broken)."""

    def __init__(
        self,
        transport: Transport,
        root: str,
        command: str,
        *,
        wait: float = DEFAULT_WAIT,
        break_lock: bool = False,
        on_wait: Callable[[LockHolder | None], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        create_root: bool = False,
    ) -> None:
        self.transport = transport
        self.root = root
        self.command = command
        self.create_root = create_root  # else a missing root is refused (a typo in `root`)
        self.path = lock_path(root)
        self.wait = wait
        self.break_lock = break_lock
        self.on_wait = on_wait
        self.sleep = sleep
        self.me = LockHolder(
            user=local_user(),
            machine=socket.gethostname(),
            pid=os.getpid(),
            command=command,
            since=now_iso(),
            token=secrets.token_hex(8),
        )
        self.held = False
        self.notes: list[str] = []

    # --- the host side: one shell command each ------------------------------------------
    def _try_create(self) -> tuple[bool, str]:
        """(created, current content when not created)."""
        info = json.dumps(asdict(self.me), sort_keys=True)
        q = shlex.quote(self.path)
        check_root = "" if self.create_root else f"[ -d {shlex.quote(self.root)} ] || exit 5; "
        script = (
            check_root + f"mkdir -p {shlex.quote(posixpath.dirname(self.path))} || exit 4; "
            f"if (set -C; printf '%s\\n' {shlex.quote(info)} > {q}) 2>/dev/null; "
            f"then echo kerneldev-lock-acquired; else cat {q} 2>/dev/null; exit 3; fi"
        )
        result = self.transport.run(script, timeout=60)
        if result.ok and "kerneldev-lock-acquired" in result.stdout:
            return True, ""
        if result.exited == 3:
            return False, result.stdout
        if result.exited == 5:
            raise self._no_root()
        raise TransferError(
            f"cannot create the lock {self.path} on {self.transport.host_name}: "
            f"{result.stderr.strip() or f'exit {result.exited}'}",
            hint=f"kerneldev needs write access to <root>/{KERNELDEV_DIR} on the host",
        )

    def _remove_if(self, token: str | None) -> None:
        """Remove the lock file if it still holds `token` (None: whatever it holds)."""
        q = shlex.quote(self.path)
        if token is None:
            script = f"rm -f -- {q}"
        else:
            script = f"grep -qF {shlex.quote(token)} {q} 2>/dev/null && rm -f -- {q}; exit 0"
        self.transport.run(script, timeout=60)

    # --- the lock taken and released inside other commands (push) -----------------------
    def scan_request(self, release_if_same: dict[str, str] | None = None) -> dict:
        """The `lock` part of a scan request (`Transport.scan`): take the lock before hashing;
        with `release_if_same` (path -> workspace sha256), release it again in the same
        command when live already has all of those bytes and nothing was left over.
        Until the answer is known this lock counts as held, so an error on the way still
        releases it (`release` removes the file only if it holds our token)."""
        self._own()
        return {
            "path": self.path,
            "line": json.dumps(asdict(self.me), sort_keys=True),
            "token": self.me.token,
            "root_must_exist": not self.create_root,
            "release_if_same": release_if_same,
            # read under the lock when it is kept: the deploy's pruning needs it
            "history": posixpath.join(self.root, HOST_HISTORY),
        }

    def took(self, answer: dict | None) -> bool:
        """Settle a scan's lock outcome: True when the scan ran under this lock (still held, or
        already released by the host when nothing could change); False when the lock was busy
        (or the transport could not take it): then call `acquire`."""
        state = (answer or {}).get("state")
        if state == "taken":
            if answer.get("released"):
                self._forget()
            return True
        self._forget()
        if state == "no_root":
            raise self._no_root()
        if state == "error":
            raise TransferError(
                f"cannot create the lock {self.path} on {self.transport.host_name}: "
                f"{answer.get('error')}",
                hint=f"kerneldev needs write access to <root>/{KERNELDEV_DIR} on the host",
            )
        return False

    def release_command(self) -> str:
        """A shell command that releases this lock, to run at the end of another command."""
        q = shlex.quote(self.path)
        return f"{{ grep -qF {shlex.quote(self.me.token)} {q} 2>/dev/null && rm -f -- {q}; true; }}"

    def released_on_host(self) -> None:
        """`release_command` ran on the host: the lock is no longer ours."""
        self._forget()

    def guard(self) -> dict:
        """What a host step checks before it acts: the lock file still holds our token
        (`AgentChain.hold`)."""
        return {"path": self.path, "token": self.me.token}

    def _own(self) -> None:
        self.held = True
        _held_tokens.add(self.me.token)
        if self not in _held_locks:
            _held_locks.append(self)

    def _forget(self) -> None:
        self.held = False
        _held_tokens.discard(self.me.token)
        if self in _held_locks:
            _held_locks.remove(self)

    def _no_root(self) -> RefusedError:
        host = self.transport.host_name
        return RefusedError(
            f"{self.command} refused: the root {self.root} does not exist on host '{host}'",
            hint=f"check `root:` of host '{host}' in the config (a typo?); to create it "
            "and push into it, run `kerneldev push --create-root`",
        )

    # --- acquire / release ---------------------------------------------------------------
    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait
        told = False
        while True:
            # Ours from the moment the file exists, not from when the answer arrives: another
            # lock of this process (same pid) reading the file in between must not find it
            # stale and take it over (two writers at once, seen under load).
            _held_tokens.add(self.me.token)
            try:
                created, content = self._try_create()
            except BaseException:
                _held_tokens.discard(self.me.token)  # its file, if made, is stale from now on
                raise
            if created:
                self._own()
                return
            _held_tokens.discard(self.me.token)
            holder = parse_holder(content)
            if self.break_lock:
                self.notes.append(
                    "broke the lock held by "
                    + (holder.describe() if holder else f"an unreadable lock file {self.path}")
                )
                self._remove_if(holder.token if holder else None)
                self.break_lock = False  # once: a new holder after that is a real one
                continue
            if holder is not None and is_stale(holder):
                self.notes.append(
                    f"took over a stale lock: {holder.describe()} is no longer running"
                )
                self._remove_if(holder.token)
                continue
            if time.monotonic() >= deadline:
                who = holder.describe() if holder else f"an unreadable lock file {self.path}"
                raise LockBusyError(
                    f"host '{self.transport.host_name}' is locked by {who}; "
                    f"gave up after waiting {self.wait:g}s",
                    holder,
                    hint="wait for that command to finish; if its process is gone (another "
                    "machine, a reboot), rerun with `--break-lock`",
                )
            if not told and self.on_wait is not None:
                self.on_wait(holder)
                told = True
            interrupt.check()
            self.sleep(POLL)
            interrupt.check()

    def release(self) -> None:
        if not self.held:
            return
        with interrupt.shield():
            self._forget()  # from now on a leftover lock file is stale
            try:
                self._remove_if(self.me.token)
            except Exception:  # noqa: BLE001, S110 - a cut connection: the lock goes stale
                pass

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_for(
    transport: Transport,
    root: str,
    command: str,
    *,
    wait: float,
    break_lock: bool,
    say: Callable[[str], None],
    warn: Callable[[str], None],
    where: str = "",
    create_root: bool = False,
    defer: bool = False,
) -> HostLock:
    """The host's lock for a command that changes live files or restarts the service, taken
    here: `say` is told whom it waits for ("waiting up to 60s for the lock{where}, held by
    ..."), `warn` each note (a stale lock taken over, a lock broken). With `defer` it is not
    taken: `sync.push` takes it in its first remote command and its notes come in the
    push's result."""

    def on_wait(holder: LockHolder | None) -> None:
        who = holder.describe() if holder else "another command"
        say(f"waiting {wait_text(wait)} for the lock{where}, held by {who}")

    lock = HostLock(
        transport,
        root,
        command,
        wait=wait,
        break_lock=break_lock,
        on_wait=on_wait,
        create_root=create_root,
    )
    if not defer:
        lock.acquire()
        for note in lock.notes:
            warn(note)
    return lock
