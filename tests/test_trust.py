"""The trust workflow as the core runs it (`kerneldev.hosts.trust`), against a real sshd: what the
user is asked, what is recorded, and what is refused. The CLI's wording is tested in
test_ssh_connection.py; here the answer comes from a plain function instead of a terminal."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneldev.config import HostConfig
from kerneldev.errors import HostKeyError
from kerneldev.hosts import trust
from kerneldev.hosts.transport.ssh import SSHTransport
from tests.sshutil import ssh_host


@pytest.fixture(autouse=True)
def _home(isolated_home):
    return isolated_home


def test_unknown_key_is_offered_and_recorded_only_after_a_yes(sshd_server, tmp_path):
    host = ssh_host(sshd_server, tmp_path, trusted=False)
    offers: list[trust.KeyOffer] = []

    declined = trust.trust_host(host, lambda offer: offers.append(offer) or False)
    assert declined.status == trust.DECLINED
    assert not Path(host.known_hosts).exists()
    name, kind, _ = sshd_server.host_key_line.split()
    (offer,) = offers
    assert (offer.host, offer.known_hosts_name, offer.key_type) == ("testhost", name, kind)
    assert offer.fingerprint.startswith("SHA256:") and not offer.jump_host
    assert offer.known_hosts == str(host.known_hosts)

    added = trust.trust_host(host, lambda offer: True)
    assert added.status == trust.ADDED and added.fingerprint == offer.fingerprint
    assert Path(host.known_hosts).read_text() == sshd_server.host_key_line
    with SSHTransport(host) as t:
        assert t.run("echo in").stdout == "in\n"

    def must_not_ask(offer):
        raise AssertionError("a trusted key must not be offered again")

    again = trust.trust_host(host, must_not_ask)
    assert again.status == trust.ALREADY_TRUSTED
    assert Path(host.known_hosts).read_text() == sshd_server.host_key_line


def test_changed_key_is_refused_and_the_error_carries_the_check(fresh_sshd, tmp_path):
    host = ssh_host(fresh_sshd, tmp_path)
    fresh_sshd.rotate_host_key()
    before = Path(host.known_hosts).read_text()
    with pytest.raises(HostKeyError) as caught:
        trust.trust_host(host, lambda offer: True)
    err = caught.value
    assert err.check is not None and err.check.status == "changed"
    assert "CHANGED" in err.message
    assert Path(host.known_hosts).read_text() == before


def test_a_local_host_has_no_key():
    host = HostConfig(name="me", root="/x", files=("a",), workspace=Path("/w"), transport="local")
    result = trust.trust_host(host, lambda offer: pytest.fail("nothing to ask"))
    assert result == trust.TrustResult("me", None, None, None, trust.LOCAL, None)
