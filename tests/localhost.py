"""A host entry for the local transport (the "host" is a folder on this machine): the one
place tests build it."""

from __future__ import annotations

from pathlib import Path

from kerneldev.config import HostConfig


def local_host(
    root: Path, workspace: Path, files: tuple[str, ...] = ("k/*.py",), **fields
) -> HostConfig:
    """Host `h` whose live tree is `root`, worked on in `workspace`; `fields` set the rest
    (service, python, ...)."""
    return HostConfig(
        name="h",
        root=str(root),
        files=files,
        workspace=workspace,
        transport="local",
        **fields,
    )
