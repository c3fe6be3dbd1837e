"""Kept sessions: one private background process per (local user, host) that holds the SSH
connection and the host agent between commands, so the next command skips the handshake,
the login and the host's Python start-up.

The first command to a host starts the holder (`holder.py`, `python -m
kerneldev.hosts.transport.session.holder`), which connects with `SSHConnection` (host keys
verified as for any connection), starts the agent and listens on a unix socket that only this
user can open (`location.py`). Every command then talks the agent's own protocol over that
socket (`client.py`, an `AgentTransport`, no paramiko in the client); the holder relays the
frames between each client and the one agent, with request ids remapped per client
(`relay.py`). It ends itself when idle, reconnects at a maximum age, and retires when the
config, ssh_config or known_hosts say something else about the host (`freshness.py`).
`control.py` lists and stops sessions; `wire.py` is what a holder says beyond the agent's frames.
See docs/sessions.md.
"""
