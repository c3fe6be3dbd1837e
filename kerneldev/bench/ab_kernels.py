"""Which attention kernel each variant of an A/B ran, and the refusal of an A/B in which two
variants ran the same one (`bench --service`, `profile`).

Before anything is restarted, the live dispatch is probed for every variant, as `kernels status`
probes it (`kernel_deploy.dispatches_under`: one probe process on the host for all variants),
in the environment the variant's switch will give the service (the env file with the variant's
assignments): the decode call's backend, with the Triton variant for kerneldev's kernels
("triton (mma)", "flashinfer", "torch"). When every
variant reaches the same kernel the comparison measures nothing but noise (on SGLang 0.5.23,
toggling only SGLANG_SM120_MMA_FLASHMLA leaves both on FlashInfer), so nothing is measured:
`SameKernelError` (exit 1) names the variants, the kernel and the variables that differ
between them and did not take effect; so does any two variants of a longer list that reach
the same kernel (the row of one would be read as another kernel's result). `allow_same=True`
(`--allow-same-kernel`) measures anyway. A variant whose kernel cannot be told (no kernel file
among the configured files, a wrapper that does not import) never refuses; the reason is kept.

`ab_session` is the setup both commands run in: this check, the variant switcher and the
host's scripts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kerneldev.bundled import install as kernel_deploy
from kerneldev.config import HostConfig
from kerneldev.errors import KerneldevError, TransferError
from kerneldev.errors import SameKernelError as SameKernelError  # re-exported: it was defined here
from kerneldev.hosts.transport.base import Transport
from kerneldev.service.envfile import read_service_env
from kerneldev.service.variants import HostScripts, VariantSwitcher


def variant_env(base: dict[str, str], host: HostConfig, name: str) -> dict[str, str]:
    """The service's environment once `name` is switched in, as `EnvFileEdit` writes it: the
    keys any variant manages are dropped, then the variant's own assignments are set."""
    svc = host.service
    variants = svc.variants if svc else {}
    managed = {k for env in variants.values() for k in env}
    env = {k: v for k, v in base.items() if k not in managed}
    env.update(variants.get(name, {}))
    return env


def kernels_of(
    transport: Transport, host: HostConfig, envs: list[dict[str, str]]
) -> list[tuple[str | None, str]]:
    """Per environment of `envs`: (the decode call's kernel under it, how it was told), from
    one probe of the live dispatch; None when unknown."""
    try:
        choices = kernel_deploy.dispatches_under(transport, host, envs)
    except KerneldevError as err:
        return [(None, f"not probed: {err.message}") for _ in envs]
    return [_kernel_name(choice) for choice in choices]


def _kernel_name(choice: kernel_deploy.BackendChoice) -> tuple[str | None, str]:
    if choice.backend is None:
        return None, choice.reason
    name = choice.backend + (f" ({choice.kernel_variant})" if choice.kernel_variant else "")
    return name, choice.reason


def differing_variables(envs: dict[str, dict[str, str]]) -> list[str]:
    """The variables whose values differ between the variants' environments."""
    keys = sorted({k for env in envs.values() for k in env})
    return [k for k in keys if len({env.get(k) for env in envs.values()}) > 1]


@dataclass
class KernelCheck:
    """Per variant of an A/B, the kernel its environment reaches; `check` refuses when all
    variants reach the same one."""

    kernels: dict[str, str | None] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    # the env file's lines that a shell, systemd and docker read differently (`parse_env_file`)
    warnings: list[str] = field(default_factory=list)

    def check(self) -> None:
        # Any two variants on one kernel, not only all of them: in simt,mma,flashinfer on
        # SGLang 0.5.23 with mma toggling only SGLANG_SM120_MMA_FLASHMLA, "mma" runs FlashInfer
        # and its row would read as the MMA kernel's result.
        by_kernel: dict[str, list[str]] = {}
        for name, kernel in self.kernels.items():
            if kernel is not None:
                by_kernel.setdefault(kernel, []).append(name)
        same = next(((k, v) for k, v in by_kernel.items() if len(v) > 1), None)
        if same is None:
            return
        kernel, group = same
        names = ", ".join(group)
        changed = differing_variables({n: self.envs.get(n, {}) for n in group})
        run = "all run" if len(group) == len(self.kernels) else "run"
        what = (
            f"{', '.join(changed)} did not take effect"
            if changed
            else "their environments do not differ"
        )
        raise SameKernelError(
            f"variants {names} {run} the same attention kernel ({kernel}): {what}; "
            "the A/B would compare a kernel with itself",
            hint="pin the backend in service.variants (SGLang 0.5.23 runs FlashInfer unless "
            "SGLANG_SM120_FLASHMLA_BACKEND=triton; `kerneldev kernels status` shows what runs), "
            "or measure anyway with --allow-same-kernel",
        )


def preflight(
    transport: Transport, host: HostConfig, variants: list[str], *, allow_same: bool = False
) -> KernelCheck:
    """Before an A/B restarts anything: probe every variant's environment (the env file with the
    variant's assignments; one probe for all) and refuse, unless `allow_same`, when all reach
    the same kernel."""
    result = KernelCheck()
    names = list(dict.fromkeys(variants))
    if len(names) < 2:
        return result
    try:
        base = read_service_env(transport, host) or {}
    except TransferError:
        base = {}
    result.warnings = list(getattr(base, "warnings", []))
    svc = host.service
    found = kernels_of(transport, host, [variant_env(base, host, name) for name in names])
    for name, (kernel, reason) in zip(names, found, strict=True):
        result.envs[name] = dict(svc.variants.get(name, {})) if svc else {}
        result.kernels[name], result.reasons[name] = kernel, reason
    if not allow_same:
        result.check()
    return result


@dataclass
class ABSession:
    """What an A/B over service variants works with, from `ab_session`."""

    switcher: VariantSwitcher
    scripts: HostScripts
    kernels: KernelCheck


@contextlib.contextmanager
def ab_session(
    transport: Transport,
    host: HostConfig,
    variants: list[str],
    say: Callable[[str], None],
    *,
    health_interval: float | None = None,
    allow_same_kernel: bool = False,
) -> Iterator[ABSession]:
    """The setup `bench --service` and `profile` share: the service's variant settings checked,
    the kernels probed (`preflight`, which may refuse) before anything restarts, then the
    switcher (the service always put back on the way out) and the host's scripts."""
    switcher = VariantSwitcher(transport, host, say, health_interval=health_interval)
    kernels = preflight(transport, host, variants, allow_same=True)
    for warning in kernels.warnings:  # before a refusal: such a line may be its cause
        say(f"warning: {host.service.env_file if host.service else 'env file'}: {warning}")
    if not allow_same_kernel:
        kernels.check()
    with switcher, HostScripts(transport, host) as scripts:
        yield ABSession(switcher, scripts, kernels)
