"""Hosts: transports (local, SSH), host keys and trust, groups, GPUs."""
