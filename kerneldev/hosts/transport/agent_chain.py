"""A deploy's host steps as one pipeline through the host agent: one round trip for all of them.

A cold push after its plan made one request per step (the incomplete-deploy marker, the
backups, the upload, the history's append with the lock's release, and the history read
of the pruning), each waiting for the one before's answer: a round trip and a forked helper
each (docs/benchmarks.md, issue 23 round 3). An `AgentChain` sends them all at once, each
opened `after` the one before (`hostside/agent.py`): the host starts a step only when the
previous one exited with status 0, so every guarantee keeps its order and its check, on the
host - the marker is written before any backup, the backups are checked against the planned
sha256 (`copyfiles.py`'s `expect`) before any file of the upload is renamed (a `copy_on_host`
followed by `put_files` is one host process: the backups in a thread while the bytes land in
temporary files, `receivefiles.py`'s `backups`), each file's compare-and-swap runs right
before its rename, and the record is appended only when every file landed
(`receivefiles.py` exits 1 otherwise). The client then reads the answers in the same order
and raises what the single operations would have raised.

The client may be gone while the host still runs the chain (a cut connection: the agent sees
the end of its stdin only later), and another command may take its lock over meanwhile (a
stale lock). So with `hold(lock)` every step checks, on the host, that the lock file still
holds this command's token right before it acts - when it begins and again before each rename
(marker, backups, upload: `receivefiles.py`, `copyfiles.py`), before the record's append
(`append_text`) - and stops the chain otherwise; its answer raises `LockLostError`.

Whatever stops the client on the way (a failed step, Ctrl-C, a read error), leaving the
`with` block settles the chain before the error goes on: the steps not started yet are
cancelled (they never run), an upload that runs has been told to abort (`_send_files`), every
step's end is awaited, and the files the host reports as landed are passed to the upload's
`on_landed`, so the deploy record lists exactly those. Only then may the caller send other
requests (recording what landed, dropping the backups): nothing of the chain runs beside them.
"""

from __future__ import annotations

import io
import json
import posixpath

from kerneldev import interrupt
from kerneldev.errors import ConnectionLostError, KerneldevError, TransferError
from kerneldev.hosts.transport.agent_client import AgentProcess
from kerneldev.hosts.transport.base import (
    TEMP_MARK,
    CommandResult,
    PutFilesCallbacks,
    PutItem,
    RunOptions,
    copy_sums,
    lock_lost,
    parse_reports,
    receive_items,
    send_file_records,
    temp_path,
)
from kerneldev.hosts.transport.hostscripts import script
from kerneldev.hostside import appendrecord as _appendrecord
from kerneldev.hostside import copyfiles as _copyfiles
from kerneldev.hostside import receivefiles as _receivefiles

# Bytes of an upload sent while the steps before it may still run (the agent holds them until
# the upload starts); a larger upload waits for the backups' answer first: one round trip,
# small beside that many bytes, and the host never holds more than this for us.
AHEAD_LIMIT = 64 << 20
SETTLE_TIMEOUT = 120.0  # seconds to wait for each step's end while settling
POLL = 0.5  # seconds between looks at Ctrl-C while waiting on the host
# What the record's append (`appendrecord.py`) prints on stderr, with exit LOCK_LOST_EXIT,
# when the lock is not ours.
LOCK_LOST = _appendrecord.LOCK_LOST
LOCK_LOST_EXIT = _appendrecord.LOCK_LOST_EXIT


class ChainStep:
    """One request of the chain; `result()` waits for it (in the order they were sent)."""

    def __init__(self, chain: AgentChain, process: AgentProcess, doing: str) -> None:
        self.chain = chain
        self.process = process
        self.doing = doing
        self.collected = False

    def _command_result(self):
        self.collected = True
        t = self.chain.transport
        result = t._finish(self.process, self.doing, RunOptions(), self.doing)
        if self.process.skipped:
            raise TransferError(
                f"{self.doing} on {t.host_name} did not run: {self.process.skip_reason}"
            )
        return result


class WriteStep(ChainStep):
    def __init__(self, chain: AgentChain, process: AgentProcess, path: str) -> None:
        super().__init__(chain, process, f"writing {path}")
        self.path = path

    def result(self) -> None:
        result = self._command_result()
        done = [r for r in parse_reports(result.stdout.encode("utf-8")) if "ok" in r]
        host = self.chain.transport.host_name
        if not done:
            raise TransferError(f"writing {self.path} on {host} ended without a report")
        if not done[0]["ok"]:
            if done[0].get("reason") == "lock":
                raise lock_lost(host, f"before writing {self.path}", done[0].get("error"))
            raise TransferError(f"cannot write {self.path} on {host}: {done[0].get('error')}")


class CopyStep(ChainStep):
    """`copy_on_host`: sent when the next step is (`process` None until then), or made by the
    upload's own process when an upload follows (`folded`: see `AgentChain.put_files`)."""

    def __init__(self, chain: AgentChain, pairs, request: dict) -> None:
        super().__init__(chain, None, "copying files on the host")
        self.pairs = pairs
        self.request = request
        self.folded = False

    def _folded_result(self) -> CommandResult:
        """The backups' part of the upload's process: its `<index> <sha256>` lines, `backups
        ok` once all were made as expected (else its error, on stderr). Waits for the process
        to end (no file is renamed before the backups are made anyway); its output stays for
        the upload's `result()`."""
        self.collected = True
        self.chain._wait_for(self.process)
        t = self.chain.transport
        if self.process.skipped:
            raise TransferError(
                f"{self.doing} on {t.host_name} did not run: {self.process.skip_reason}"
            )
        stdout = self.process.peek_stdout().decode("utf-8", "replace")
        made = "backups ok" in stdout.splitlines()
        return CommandResult(self.doing, 0 if made else 1, stdout, self.process.stderr_text())

    def result(self) -> dict[str, str | None]:
        """{destination: sha256} as `Transport.copy_on_host`; a copy whose sum was not the
        expected one stopped the chain and is in the sums for the caller's own check."""
        host = self.chain.transport.host_name
        if self.process is None:
            self.chain._send_copy()
        result = self._folded_result() if self.folded else self._command_result()
        if not result.ok and "copyfiles: lock taken over:" in result.stderr:
            why = result.stderr.split("copyfiles: lock taken over:", 1)[1].strip()
            raise lock_lost(host, "before copying the backups", why)
        return copy_sums(host, self.pairs, result)


class UploadStep(ChainStep):
    def __init__(self, chain, process, items: list[PutItem], callbacks: PutFilesCallbacks) -> None:
        super().__init__(chain, process, "uploading files")
        self.items = items
        self.callbacks = callbacks
        self.sent: dict[int, tuple[str, int]] = {}  # index -> (sha256, size) of what was sent

    @property
    def all_sent(self) -> bool:
        return len(self.sent) == len(self.items)

    def result(self) -> None:
        """As `Transport.put_files`: `on_landed` for each file renamed, then the first failure.
        Ctrl-C while the host still lands files stops it (see `AgentChain.settle`)."""
        self.chain._wait_for(self.process)
        self.collected = True
        t = self.chain.transport
        t._settle_files(self.process, self.items, self.sent, None, self.callbacks)


class RunStep(ChainStep):
    def result(self) -> CommandResult:
        """The command's result; `LockLostError` when its lock guard stopped it."""
        result = self._command_result()
        if result.exited == LOCK_LOST_EXIT and LOCK_LOST in result.stderr:
            why = result.stderr.split(LOCK_LOST, 1)[1].strip()
            raise lock_lost(self.chain.transport.host_name, f"before {self.doing}", why)
        return result

    @property
    def succeeded(self) -> bool:
        """It ran and exited 0 (also when it was only awaited by `settle`)."""
        process = self.process
        return process.exited and process.status == 0 and process.start_error is None


class AgentChain:
    """Steps sent at once, each run by the host only after the one before succeeded. Use as a
    context manager; read each step's `result()` in order inside it."""

    def __init__(self, transport) -> None:
        # an `over_agent.AgentTransport` (not imported here: it imports this module)
        self.transport = transport
        self.steps: list[ChainStep] = []
        self.lock: dict | None = None  # {"path", "token"}: see `hold`
        self.copy: CopyStep | None = None  # the backups not sent yet: see `copy_on_host`

    def hold(self, lock: dict | None) -> None:
        """Every step sent from now on first checks on the host that the lock file `path`
        still holds `token` (the command's host lock was not taken over), and fails else."""
        self.lock = lock

    def __enter__(self) -> AgentChain:
        return self

    def __exit__(self, kind, err, tb) -> None:
        if err is None and self.copy is not None:
            self._send_copy()  # asked for, never followed: it runs (and is awaited) as asked
        if err is not None or any(not s.collected for s in self.steps):
            self.settle()

    @property
    def _last(self) -> AgentProcess | None:
        return self.steps[-1].process if self.steps else None

    def _open(self, command: str, doing: str, python: bool, stdin: bytes | None) -> AgentProcess:
        if self.copy is not None:
            self._send_copy()
        return self.transport._open(command, doing, python=python, stdin=stdin, after=self._last)

    def _send_copy(self) -> None:
        """The pending `copy_on_host` sent as its own step (`copyfiles.py`)."""
        step, self.copy = self.copy, None
        stdin = json.dumps(step.request).encode("utf-8")
        step.process = self._open(script(_copyfiles), "copying files on the host", True, stdin)
        self.steps.append(step)

    # --- the steps --------------------------------------------------------------------------
    def write_atomic(self, path: str, data: bytes) -> WriteStep:
        """`Transport.write_atomic` (mode kept, 0o644 for a new file; folders created)."""
        item = {"path": path, "mode": None, "expect": None, "check": False}
        fields: dict = {"mark": TEMP_MARK, "files": [item]}
        if self.lock is not None:
            fields["lock"] = self.lock
        request = json.dumps(fields).encode("utf-8")
        parts = [len(request).to_bytes(8, "big"), request]
        send_file_records(parts.append, lambda: io.BytesIO(data), path, None)
        process = self._open(script(_receivefiles), f"writing {path}", True, b"".join(parts))
        step = WriteStep(self, process, path)
        self.steps.append(step)
        return step

    def copy_on_host(self, pairs: list[tuple[str, str]], expect: list[str | None]) -> CopyStep:
        """`Transport.copy_on_host`, each copy's sum checked on the host against `expect`.
        Sent with the next step: an upload (`put_files`) makes the backups in its own process
        before it renames anything; any other step (or `result()`) sends it as its own
        (`copyfiles.py`), as before that step."""
        items = [[src, temp_path(*posixpath.split(dst)), dst] for src, dst in pairs]
        fields: dict = {"items": items, "expect": expect}
        if self.lock is not None:
            fields["lock"] = self.lock
        if self.copy is not None:
            self._send_copy()
        self.copy = CopyStep(self, pairs, fields)
        return self.copy

    def put_files(
        self, items: list[PutItem], callbacks: PutFilesCallbacks, size: int
    ) -> UploadStep:
        """`Transport.put_files` of `size` bytes in all: the bytes are sent here (behind the
        steps before, which the host finishes first); `result()` reads what landed. Right
        after `copy_on_host`, the backups are made by the same process (`receivefiles.py`'s
        `backups`): in a thread while the bytes land in their temporary files, no file renamed
        before every backup is made and checked (the backups' folder and the live tree create
        their new files side by side: docs/benchmarks.md, issue 23 round 7)."""
        t = self.transport
        copy, self.copy = self.copy, None
        before = self._last
        backups = copy.request if copy is not None else None
        process = t._start_receiving(
            receive_items(items), after=before, lock=self.lock, backups=backups
        )
        if copy is not None:
            copy.process, copy.folded = process, True
        step = UploadStep(self, process, items, callbacks)
        self.steps.append(step)
        if before is not None and size > AHEAD_LIMIT:
            self._wait_for(before)
        step.sent, stopped = t._send_files(process, items, callbacks)
        if stopped is not None:
            raise stopped  # the host was told to abort; leaving the block settles the chain
        try:
            process.close_stdin()
        except ConnectionLostError:
            raise t._lost("uploading files") from None
        return step

    def append_text(
        self,
        path: str,
        text: str,
        remove: tuple[str, ...] | list[str] = (),
        release: dict | None = None,
    ) -> RunStep:
        """`Transport.append_text`, then the files of `remove` removed and, with `release`
        (`HostLock.guard()`), that lock file removed while it holds its token: one helper
        process (`appendrecord.py`), where the shell's `then` took seven programs. With
        `hold`, nothing is done unless the lock is still ours (exit LOCK_LOST_EXIT)."""
        fields = {"path": path, "lock": self.lock, "remove": list(remove), "release": release}
        request = json.dumps(fields).encode("utf-8")
        stdin = len(request).to_bytes(8, "big") + request + text.encode("utf-8")
        process = self._open(script(_appendrecord), f"appending to {path}", True, stdin)
        step = RunStep(self, process, f"appending to {path}")
        self.steps.append(step)
        return step

    # --- ending -----------------------------------------------------------------------------
    def _wait_for(self, process: AgentProcess) -> None:
        """Until `process` ended (Ctrl-C honoured); its answer is read after."""
        try:
            while True:
                try:
                    process.wait(POLL)
                    return
                except TimeoutError:
                    interrupt.check()
        except ConnectionLostError:
            raise self.transport._lost("deploying") from None

    def settle(self) -> None:
        """After a failure: nothing of the chain starts any more, an upload still landing
        files stops at its next safe point (SIGINT: `receivefiles.py`), and every step has
        ended; the upload's landed files are reported to its `on_landed`."""
        with interrupt.shield():
            left = [s for s in self.steps if not s.collected]
            try:
                for step in left:
                    step.process.signal("CANCEL")
                for step in left:
                    if isinstance(step, UploadStep):
                        step.process.signal("INT")
            except ConnectionLostError:
                return  # the host ends everything itself (the agent's EOF)
            for step in left:
                step.collected = True
                try:
                    if isinstance(step, UploadStep):
                        step.result()  # on_landed for what landed; its error is not ours
                    else:
                        step.process.wait(SETTLE_TIMEOUT)
                except (KerneldevError, TimeoutError, OSError):
                    pass
