from __future__ import annotations

import pytest

from tests.sshd import SSHServer, find_sshd, start_sshd


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory) -> SSHServer:
    """One real sshd for the session. Tests that rotate its key must use `fresh_sshd`."""
    if find_sshd() is None:
        pytest.skip("sshd is not installed (.ci/run installs openssh-server)")
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def fresh_sshd(tmp_path_factory) -> SSHServer:
    """A private sshd for tests that change its host key or stop it."""
    if find_sshd() is None:
        pytest.skip("sshd is not installed (.ci/run installs openssh-server)")
    server = start_sshd(tmp_path_factory.mktemp("sshd-own"))
    yield server
    server.stop()
