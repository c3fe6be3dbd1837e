"""The push pipeline's seams as data: a stopped deploy's tally, the one summary built from it,
the release step's outcome, and the one host-selection rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneldev import interrupt
from kerneldev.config import Config
from kerneldev.errors import DeployTally, KerneldevError, PartialDeployError, UnhealthyError
from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.loop import deploy_tally, push_pipeline, release, sync
from kerneldev.loop.state import DeployRecord
from tests.localhost import local_host
from tests.test_sync import FailingTransport


@pytest.fixture
def host(tmp_path):
    root = tmp_path / "live"
    (root / "k").mkdir(parents=True)
    for name in ("a.py", "b.py", "c.py"):
        (root / "k" / name).write_text(f"{name} v1\n")
    return local_host(root, tmp_path / "ws", files=("k/*.py",))


def _edit_all(host) -> None:
    sync.pull(LocalTransport(host), host)
    for name in ("a.py", "b.py", "c.py"):
        (Path(host.workspace) / "k" / name).write_text(f"{name} v2\n")


def test_the_summary_is_built_from_the_tally():
    assert deploy_tally.summary(DeployTally(("k/a.py",), ("k/b.py", "k/c.py"))) == (
        "Deployed: k/a.py\nNot deployed: k/b.py, k/c.py"
    )
    assert deploy_tally.summary(DeployTally((), None)) == (
        "Deployed: (none)\nNot deployed: everything (stopped before the upload)"
    )
    assert deploy_tally.summary(DeployTally(("k/a.py",), (), "d1")) == (
        "Deployed: k/a.py as d1\nNot deployed: (none)"
    )
    many = tuple(f"k/{i}.py" for i in range(25))
    assert deploy_tally.summary(DeployTally(many, ())).startswith("Deployed: k/0.py, ")
    assert "k/19.py and 5 more\n" in deploy_tally.summary(DeployTally(many, ()))


def test_attach_adds_the_summary_once():
    err = KerneldevError("stopped")
    deploy_tally.attach(err, DeployTally(("k/a.py",), ()))
    deploy_tally.attach(err, DeployTally((), None))  # an outer layer: the inner tally stands
    assert err.tally == DeployTally(("k/a.py",), ())
    assert err.message == "stopped\nDeployed: k/a.py\nNot deployed: (none)"


def test_the_tally_is_the_json_report_of_an_error_without_one():
    """`--json` on failure prints the error's report: a stopped push's says what landed."""
    err = deploy_tally.attach(KerneldevError("stopped"), DeployTally(("k/a.py",), ("k/b.py",)))
    assert err.report == {
        "deployed": ["k/a.py"],
        "not_deployed": ["k/b.py"],
        "deploy_id": None,
        "unconfirmed": False,
    }
    before = deploy_tally.attach(KerneldevError("stopped"), DeployTally((), None))
    assert before.report["not_deployed"] is None  # stopped before the upload
    # A report the error already has keeps its own keys (a push object's `deployed`).
    own = KerneldevError("unhealthy", report={"host": "h", "deployed": ["k/a.py", "k/b.py"]})
    deploy_tally.attach(own, DeployTally(("k/a.py", "k/b.py"), (), "d1"))
    assert own.report["host"] == "h" and own.report["deployed"] == ["k/a.py", "k/b.py"]
    assert own.report["not_deployed"] == [] and own.report["deploy_id"] == "d1"


def test_files_whose_answer_a_lost_connection_cut_off_are_not_confirmed():
    tally = DeployTally(("k/a.py",), ("k/b.py", "k/c.py"), unconfirmed=True)
    text = deploy_tally.summary(tally)
    assert text.startswith("Deployed: k/a.py\nNot confirmed: k/b.py, k/c.py (the connection ")
    assert "Not deployed" not in text and "`kerneldev diff` shows which" in text
    # Nothing in question: as before.
    assert deploy_tally.summary(DeployTally(("k/a.py",), (), unconfirmed=True)) == (
        "Deployed: k/a.py\nNot deployed: (none)"
    )


def test_a_partial_push_carries_what_landed_as_data(host):
    _edit_all(host)
    with pytest.raises(PartialDeployError) as caught:
        sync.push(FailingTransport(host, "k/b.py"), host)
    assert caught.value.tally == DeployTally(("k/a.py",), ("k/b.py", "k/c.py"))
    # The message says the same, built from the tally.
    assert caught.value.message.endswith("\n" + deploy_tally.summary(caught.value.tally))


def test_a_deploy_stopped_by_a_signal_carries_its_tally(host):
    _edit_all(host)
    transport = LocalTransport(host)
    record = DeployRecord(id="d1", time="t", host=host.name, user="u", kind="push")
    steps = [
        push_pipeline.DeployStep(f"k/{n}.py", None, None, None, new_sha256="x") for n in ("a", "b")
    ]
    deploy = push_pipeline.Deploy(host, record, steps, force=True)

    def land(deploy, landed):
        raise interrupt.Interrupted(2)

    with pytest.raises(interrupt.Interrupted) as caught:
        push_pipeline.run_deploy(transport, deploy, land)
    assert caught.value.tally == DeployTally((), ("k/a.py", "k/b.py"))
    assert caught.value.message.startswith("push d1 interrupted by Ctrl-C\nDeployed: (none)")
    assert record.complete is False and record.outcome == "interrupted"


def test_the_release_step_rolls_back_an_unhealthy_deploy(host):
    _edit_all(host)
    transport = LocalTransport(host)
    result = sync.push(transport, host)
    said = []
    health = iter([UnhealthyError("no health", "", health=None), "healthy"])

    def restart():
        got = next(health)
        if isinstance(got, Exception):
            raise got
        return got

    hooks = release.ReleaseHooks(restart, lambda e: said.append(e.message), said.append)
    outcome = release.restart_or_roll_back(transport, host, result.deploy_id, hooks)
    assert outcome.unhealthy is not None and outcome.rollback is not None
    assert outcome.after == "healthy again with the previous files"
    assert said[0] == "no health" and said[1] is outcome.rollback
    assert (Path(host.root) / "k/a.py").read_text() == "a.py v1\n"
    with pytest.raises(UnhealthyError) as caught:
        release.raise_unless_healthy(result, outcome)
    assert caught.value.report is result and result.auto_rollback is outcome.rollback


def test_one_rule_chooses_the_host(tmp_path, monkeypatch):
    config = Config(tmp_path / "hosts.yaml", default="d", workspace_host="w")
    monkeypatch.delenv("KERNELDEV_HOST", raising=False)
    assert config.choose("n") == ("n", False)
    assert config.choose(None) == ("w", False)
    assert Config(tmp_path / "h", default="d").choose(None) == ("d", False)
    monkeypatch.setenv("KERNELDEV_HOST", "e")
    assert config.choose(None) == ("e", True)
    assert config.choose("n") == ("n", False)
