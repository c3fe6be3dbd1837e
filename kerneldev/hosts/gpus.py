"""The host's GPUs as `nvidia-smi --query-gpu` reports them: name, memory, utilisation and
compute capability. One remote command; a host without nvidia-smi is a normal answer
("no nvidia-smi"), not an error, since kerneldev also drives hosts without GPUs.

Drivers older than about R510 do not know the `compute_cap` field and refuse the whole query,
so the command asks again without it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field

from kerneldev.hosts.transport.base import Transport

FIELDS = "index,name,memory.used,memory.total,utilization.gpu"
NO_NVIDIA_SMI = "no nvidia-smi"
_MISSING_EXIT = 127  # the shell's "command not found"
QUERY_TIMEOUT = 30.0  # seconds; nvidia-smi can hang on a wedged driver

QUERY_COMMAND = (
    f"command -v nvidia-smi >/dev/null 2>&1 || exit {_MISSING_EXIT}; "
    f"out=$(nvidia-smi --query-gpu={FIELDS},compute_cap --format=csv,noheader,nounits 2>&1) "
    '&& printf "%s\\n" "$out" '
    f"|| nvidia-smi --query-gpu={FIELDS} --format=csv,noheader,nounits"
)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    compute_cap: str | None  # "9.0"; None where the driver does not report it


@dataclass(frozen=True)
class GpuReport:
    """`present`: nvidia-smi ran and answered; `note` says why not ("no nvidia-smi", or the
    error of a failing nvidia-smi, e.g. no driver loaded)."""

    present: bool
    gpus: list[Gpu] = field(default_factory=list)
    note: str | None = None

    @property
    def failed(self) -> bool:
        """nvidia-smi is there but did not answer: a driver problem worth a warning."""
        return not self.present and self.note not in (None, NO_NVIDIA_SMI)


def query_gpus(transport: Transport) -> GpuReport:
    """Ask the host's nvidia-smi (one command). Raises only what the transport raises (an
    unreachable host, a timeout)."""
    result = transport.run(QUERY_COMMAND, timeout=QUERY_TIMEOUT)
    if result.exited == _MISSING_EXIT and not result.stdout.strip():
        return GpuReport(False, note=NO_NVIDIA_SMI)
    if not result.ok:
        text = (result.stderr.strip() or result.stdout.strip()).splitlines()
        reason = text[-1] if text else f"exit {result.exited}"
        return GpuReport(False, note=f"nvidia-smi failed: {reason}")
    return GpuReport(True, parse_query(result.stdout))


def parse_query(text: str) -> list[Gpu]:
    """The CSV lines of `nvidia-smi --query-gpu=FIELDS[,compute_cap] --format=csv,noheader,
    nounits`; `[N/A]` and `[Not Supported]` become None."""
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if len(row) < 5:
            continue
        cap = row[5].strip() if len(row) > 5 else None
        gpus.append(
            Gpu(
                index=_int(row[0]) or 0,
                name=row[1].strip(),
                memory_used_mib=_int(row[2]),
                memory_total_mib=_int(row[3]),
                utilization_pct=_int(row[4]),
                compute_cap=cap if cap and not cap.startswith("[") else None,
            )
        )
    return gpus


def _int(text: str) -> int | None:
    try:
        return int(float(text.strip()))
    except ValueError:
        return None
