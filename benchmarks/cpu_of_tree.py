"""Wall time, CPU time and load of a command and of every process it starts, daemons included.

`time` counts only the children a process waited for; the test suite's services, sshds and
session holders detach (double fork, setsid) and are reaped by init, so their CPU never shows.
Here the command runs under a child subreaper (Linux PR_SET_CHILD_SUBREAPER): whatever detaches
is re-parented to this process and reaped here at once, so RUSAGE_CHILDREN holds it all. After
the command exits, what it left running is waited for up to 60 s more (then reported as is).

    python benchmarks/cpu_of_tree.py bash scripts/bootstrap test
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
LINGER_S = 60.0
LOAD_EVERY_S = 15.0


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: cpu_of_tree.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cpu_of_tree: prctl(PR_SET_CHILD_SUBREAPER) failed (Linux only)", file=sys.stderr)
        return 2
    loads: list[float] = []

    def sample() -> None:
        while True:
            loads.append(os.getloadavg()[0])
            time.sleep(LOAD_EVERY_S)

    threading.Thread(target=sample, daemon=True).start()
    start, load_start = time.monotonic(), os.getloadavg()[0]
    main_pid = subprocess.Popen(argv).pid
    code = wall = load_end = None
    linger_until = 0.0
    while True:
        try:
            if code is None:
                pid, status = os.wait()
            else:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    if time.monotonic() > linger_until:
                        break
                    time.sleep(0.5)
                    continue
        except ChildProcessError:
            break  # nothing left
        if pid == main_pid:
            code, wall = os.waitstatus_to_exitcode(status), time.monotonic() - start
            load_end, linger_until = os.getloadavg()[0], time.monotonic() + LINGER_S
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    mean = sum(loads) / len(loads) if loads else load_start
    print(
        f"cpu_of_tree: exit {code}, wall {wall:.1f} s, CPU {cpu:.1f} s (user {usage.ru_utime:.1f}"
        f" + sys {usage.ru_stime:.1f}; {cpu / 60:.1f} core-min, {cpu / wall:.2f} cores), load "
        f"average start {load_start:.2f} end {load_end:.2f} mean {mean:.2f} max "
        f"{max(loads, default=load_start):.2f}",
        file=sys.stderr,
    )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
