"""A one-shot loop command's ssh, started before the CLI is imported.

Importing the CLI (typer, the command modules, rich) takes ~0.45 s of a cold `pull`, `diff`
or `push` on a 2-core machine before the command reaches its host; the system's ssh
(`hosts/transport/one_shot.py`) is a process of its own and can log in and start the host
agent meanwhile. `start(argv)` reads only what picks the host (`--config`, `--host`,
`--no-keep`, the config file) and starts that ssh; the command's transport takes it over
(`openssh.start_early`). Anything unusual (help, a group, a config error, a kept session,
OpenSSH not to be used) starts nothing: the command then does all it did before, and reports
every error itself.
"""

from __future__ import annotations

COMMANDS = ("pull", "diff", "push")


def start(argv: list[str]) -> None:
    """Start the ssh of `argv`'s one-shot loop command, if it is one."""
    from kerneldev.cli.warm_client import command_of

    before = argv[: argv.index("--")] if "--" in argv else argv
    if command_of(before) not in COMMANDS or "--help" in before or "-h" in before:
        return
    try:
        config_path, host_name = _value(before, "--config"), _value(before, "--host")
        from kerneldev.config import load_config
        from kerneldev.hosts.transport.session.keep import keep_wanted

        host = load_config(config_path).host(host_name)
        if keep_wanted(host, False if "--no-keep" in before else None):
            return
        from kerneldev.hosts.transport.openssh import start_early

        start_early(host)
    except Exception:  # noqa: BLE001, S110 - only a head start: the command reports errors itself
        pass


def _value(argv: list[str], option: str) -> str | None:
    """The one value of `option` in `argv` (`--opt V` or `--opt=V`); ValueError when given
    twice or without a value (the CLI itself says what is wrong)."""
    found = []
    for i, arg in enumerate(argv):
        if arg == option:
            if i + 1 >= len(argv):
                raise ValueError(option)
            found.append(argv[i + 1])
        elif arg.startswith(option + "="):
            found.append(arg[len(option) + 1 :])
    if len(found) > 1:
        raise ValueError(option)
    return found[0] if found else None
