"""The benchmark harness as the laptop side sees it: the one place kerneldev touches it.

The harness is `kernels/dsv4_bench.py`. `kerneldev bench` copies it to the GPU host together with
the files it imports (`SUPPORT_FILES`) and runs it there (`SCRIPT` + `arguments`). It is also a
module of this package: setuptools installs the `kernels/` folder as `kerneldev.kernels`
(`[tool.setuptools.package-dir]` in pyproject.toml), so `kernels/dsv4_bench.py` imports as
`kerneldev.kernels.dsv4_bench`. At import time it needs only the standard library (torch and
triton load inside its `main`), which is what lets a laptop without torch import it here.

What kerneldev relies on, and nothing more (a change to any of it in the harness is a change
here; tests/test_bench.py runs both sides together):
- `SCHEMA`, the schema id of the result JSON it writes (docs/bench-json.md);
- its exit statuses `EXIT_OK` (ran, all passed), `EXIT_FAILED` (ran, a variant failed accuracy)
  and `EXIT_ENV` (torch, triton or the GPU is missing);
- `ENTRY_POINT`, the function a kernel file must define (named in its import errors, which
  also name the kernel file's path as given);
- `DISPATCH`, its pseudo-variant name for "call without `variant=`", and `FLASHINFER`, the one
  for FlashInfer's sm_120 DSv4 decode (skipped, with a reason in the JSON's `skipped`, where the
  host lacks it);
- its parsers of variant lists and shape specs, so bad input is refused before connecting;
- its command line: `--kernel NAME=PATH --variants A,B --shapes SPEC... --out FILE --no-table
  [--rotate N] [--cpu-mode]`.
The harness draws its own table (`--no-table` turns it off): it runs on the host with the
standard library only, so it cannot use the CLI's renderer.
"""

from __future__ import annotations

import shlex
from importlib import resources
from pathlib import Path

from kerneldev.errors import BenchError
from kerneldev.kernels import dsv4_bench as _harness

SCHEMA: str = _harness.SCHEMA
EXIT_OK: int = _harness.EXIT_OK
EXIT_FAILED: int = _harness.EXIT_FAILED
EXIT_ENV: int = _harness.EXIT_ENV
HarnessError = _harness.HarnessError  # what the parsers raise; `str(err)` is the message
# The pseudo-variant "call the entry without `variant=`" (the file then picks by environment).
DISPATCH: str = _harness.DISPATCH
# The pseudo-variant "FlashInfer's sm_120 DSv4 decode", run where the host has it.
FLASHINFER: str = _harness.FLASHINFER
# The function a kernel file must define.
ENTRY_POINT: str = _harness.ENTRY_POINT

SCRIPT = "dsv4_bench.py"
# The harness and what it imports, copied next to each other on the host (the interpreter
# trims of `--cpu-mode` included).
SUPPORT_FILES = (SCRIPT, "dsv4_cache.py", "dsv4_reference.py", "interpreter_overhead.py")


def parse_variants(variants: list[str]) -> list[str]:
    """The variant names, checked and without repeats; `HarnessError` when one is malformed."""
    return _harness._parse_variants(",".join(variants))


def parse_shapes(specs: list[str]) -> list:
    """The shapes that shape-set names and `key=value,...` specs stand for; `HarnessError`
    when one is unknown or malformed."""
    return _harness.parse_shapes(list(specs))


def arguments(
    kernel: str,
    variants: list[str],
    shapes: list[str],
    out: str,
    *,
    rotate: int | None = None,
    cpu_mode: bool = False,
) -> list[str]:
    """The harness's command-line arguments, each shell-quoted. `kernel` is `NAME=PATH`."""
    q = shlex.quote
    args = [
        f"--kernel {q(kernel)}",
        f"--variants {q(','.join(variants))}",
        *(f"--shapes {q(s)}" for s in shapes),
        f"--out {q(out)}",
        "--no-table",
    ]
    if rotate is not None:
        args.append(f"--rotate {int(rotate)}")
    if cpu_mode:
        args.append("--cpu-mode")
    return args


def bundled_file(name: str) -> Path:
    """A file of the bundled `kernels/` folder (the `kerneldev.kernels` package)."""
    path = Path(str(resources.files("kerneldev.kernels") / name))
    if not path.is_file():
        raise BenchError(f"the bundled kernels folder has no {name} ({path})")
    return path
