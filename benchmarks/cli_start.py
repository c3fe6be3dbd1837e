"""CPU-seconds of one `python -m kerneldev ARGS` process, the start-up every CLI child of the
test suite and every one-shot command pays.

Each command line (one per argument, split like a shell) runs REPEAT times in a fresh child
with kept sessions and the warm process off (KERNELDEV_NO_KEEP=1, as in the tests) and
bytecode on; printed: the median and the lowest user+sys CPU-s of the child (os.wait4, so only
that process), its exit status, and the load average around the runs. Timings on a shared
machine need the load next to them; CPU-s move less with load than wall time. With `--tree DIR`
(repeatable) each command runs from each tree in turn (in that folder, its kerneldev on
PYTHONPATH: `python -m` puts the folder first on sys.path), the runs interleaved so that every
tree sees the same load.

    python benchmarks/cli_start.py --tree /tmp/base --tree . -- "--help"
    python benchmarks/cli_start.py --repeat 7 -- "--help" "pull --help" "--config hosts.yaml diff"
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys


def cpu_of(argv: list[str], env: dict[str, str], cwd: str | None) -> tuple[float, int]:
    """user+sys CPU-s and exit status of one child running `argv` in `cwd`."""
    child = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, child.returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="CPU-s of one `python -m kerneldev ARGS` process.")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--tree", action="append", default=[], help="a kerneldev checkout")
    parser.add_argument(
        "commands", nargs="+", help="kerneldev arguments, one command per string (after --)"
    )
    args = parser.parse_args(argv)
    env = {**os.environ, "KERNELDEV_NO_KEEP": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    trees = [os.path.abspath(t) for t in args.tree] or [None]
    path = env.get("PYTHONPATH", "")
    envs = {
        tree: env
        if tree is None
        else {**env, "PYTHONPATH": os.pathsep.join(filter(None, [path, tree]))}
        for tree in trees
    }
    for command in args.commands:
        line = [args.python, "-m", "kerneldev", *shlex.split(command)]
        runs: dict = {tree: [] for tree in trees}
        for tree in trees:
            cpu_of(line, envs[tree], tree)  # once unmeasured: bytecode written, page cache warm
        for _ in range(args.repeat):
            for tree in trees:
                runs[tree].append(cpu_of(line, envs[tree], tree))
        for tree in trees:
            cpus = [cpu for cpu, _ in runs[tree]]
            codes = ",".join(map(str, sorted({code for _, code in runs[tree]})))
            print(
                f"{statistics.median(cpus):6.3f} median  {min(cpus):6.3f} min CPU-s  exit {codes}  "
                f"load {os.getloadavg()[0]:4.1f}  {tree or ''}  kerneldev {command}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
