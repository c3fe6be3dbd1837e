"""A real OpenSSH sshd on 127.0.0.1 for the tests: temporary host key, temporary user key,
free port. Nothing here mocks SSH; the tests talk to this server through paramiko.

The implementation lives in `kerneldev.sandbox.host`, which the demo's sandbox host uses too."""

from kerneldev.sandbox.host import SSHServer, find_sshd, free_port, keygen, start_sshd

__all__ = ["SSHServer", "find_sshd", "free_port", "keygen", "start_sshd"]
