"""`kerneldev bench --service` and `kerneldev profile`: the env file, the metrics and verdicts,
the trace summary, and both commands end to end against the sandbox's decode service, over
the local transport and the loopback sshd."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kerneldev import interrupt
from kerneldev.bench import service_bench as sb
from kerneldev.config import HostConfig, ServiceConfig, load_config
from kerneldev.errors import ConfigError, KerneldevError, RefusedError, ServiceError, UsageError
from kerneldev.hosts.transport.local import LocalTransport
from kerneldev.hostside import trace_summary
from kerneldev.sandbox.host import create_sandbox, decode_service_available, find_sshd
from kerneldev.service.envfile import EnvFileEdit, parse_env_file, render
from kerneldev.service.variants import (
    RestartSkippedError,
    VariantSwitcher,
    check_variants,
    service_url,
)
from tests.clirun import run_kerneldev
from tests.localhost import local_host

ROOT = Path(__file__).resolve().parent.parent
MMA = {"SGLANG_SM120_FLASHMLA_BACKEND": "triton", "SGLANG_SM120_MMA_FLASHMLA": "1"}
SIMT = {"SGLANG_SM120_FLASHMLA_BACKEND": "triton", "SGLANG_SM120_MMA_FLASHMLA": "0"}


# --- the env file -------------------------------------------------------------------------


def test_render_touches_only_managed_keys():
    text = "# mine\nexport CUDA_VISIBLE_DEVICES=0\nSGLANG_SM120_MMA_FLASHMLA=0\nOTHER='a b'\n"
    managed = {"SGLANG_SM120_MMA_FLASHMLA", "SGLANG_SM120_FLASHMLA_BACKEND"}
    out = render(text, managed, MMA)
    assert out == (
        "# mine\nexport CUDA_VISIBLE_DEVICES=0\nSGLANG_SM120_MMA_FLASHMLA=1\nOTHER='a b'\n"
        "SGLANG_SM120_FLASHMLA_BACKEND=triton\n"
    )
    # A variant that does not set a managed key removes its line (the service's default).
    only_backend = render(out, managed, {"SGLANG_SM120_FLASHMLA_BACKEND": "flashinfer"})
    assert "SGLANG_SM120_MMA_FLASHMLA" not in only_backend and "OTHER='a b'" in only_backend
    assert render("", managed, {"X": "a b"}) == "X='a b'\n"


def test_env_file_restore_gives_back_the_original_bytes(tmp_path):
    path = tmp_path / "svc.env"
    original = "# keep me\nSGLANG_SM120_MMA_FLASHMLA=0\nA=1"  # no final newline
    path.write_text(original)
    edit = EnvFileEdit(LocalTransport(_host(tmp_path)), str(path), MMA)
    edit.apply(MMA)
    edit.apply(SIMT)
    assert "SGLANG_SM120_FLASHMLA_BACKEND=triton" in path.read_text()
    edit.restore()
    assert path.read_text() == original

    # A file that did not exist is removed again.
    absent = tmp_path / "new.env"
    edit = EnvFileEdit(LocalTransport(_host(tmp_path)), str(absent), MMA)
    edit.apply(MMA)
    assert absent.exists()
    edit.restore()
    assert not absent.exists()


def test_a_sourced_env_file_keeps_export_and_the_restart_sees_the_variant(tmp_path):
    # A restart script that only sources the file (no `set -a`): only exported variables
    # reach the process it starts.
    env = tmp_path / "svc.env"
    original = "# sourced\nexport SGLANG_SM120_MMA_FLASHMLA=0\nexport CUDA_VISIBLE_DEVICES=0\n"
    env.write_text(original)
    seen = tmp_path / "seen.log"
    restart = (
        f". {env}; sh -c 'echo \"$SGLANG_SM120_MMA_FLASHMLA/$SGLANG_SM120_FLASHMLA_BACKEND\"'"
        f" >> {seen}"
    )
    variants = {"mma": MMA, "none": {}, "simt": SIMT}
    host = _host(tmp_path, restart=restart, health="true", env_file=str(env), variants=variants)
    with VariantSwitcher(LocalTransport(host), host) as switcher:
        switcher.switch("mma")  # one key rewritten, one added
        assert "export SGLANG_SM120_MMA_FLASHMLA=1\n" in env.read_text()
        assert "export SGLANG_SM120_FLASHMLA_BACKEND=triton\n" in env.read_text()
        switcher.switch("none")  # every managed line removed ...
        switcher.switch("simt")  # ... and added back, still exported
    assert seen.read_text().splitlines() == ["1/triton", "/", "0/triton", "0/"]
    assert env.read_text() == original
    # No managed line yet: a key added to a file of export lines is exported too.
    assert render("export A=1\n", {"K"}, {"K": "v"}) == "export A=1\nexport K=v\n"


# The QA matrix: lines a shell, systemd's EnvironmentFile= and docker's --env-file read
# differently. kerneldev takes the shell's reading and warns, naming the line and the readers.
READ_DIFFERENTLY = [
    ("KEY=triton # c\n", {"KEY": "triton"}, "KEY='triton # c'"),
    ('KEY="triton" # c\n', {"KEY": "triton"}, "KEY='triton# c'"),
    ("export A=triton B=1\n", {"A": "triton", "B": "1"}, "A='triton B=1'"),
    ("KEY=tri\\\nton\n", {"KEY": "triton"}, "KEY='tri\\\\'"),  # docker: no continuation
    ("KEY = triton\n", {}, "runs `KEY` as a command"),
    ("KEY=triton\nunset KEY\n", {}, "systemd's EnvironmentFile=: ignores it"),
    ("A=1\nB='x y'\n", {"A": "1", "B": "x y"}, "docker's --env-file: B=\"'x y'\""),
    ("KEY=triton\r\n", {"KEY": "triton\r"}, "systemd's EnvironmentFile=: KEY=triton"),
    ("KEY=$HOME\n", {"KEY": "$HOME"}, "kerneldev cannot tell"),
    (". /dev/null\n", {}, "kerneldev cannot tell what `.` sets"),
]


@pytest.mark.parametrize(("text", "env", "said"), READ_DIFFERENTLY)
def test_env_file_lines_read_differently_are_read_as_a_shell_does_with_a_warning(text, env, said):
    parsed = parse_env_file(text)
    assert dict(parsed) == env
    assert len(parsed.warnings) == 1, parsed.warnings
    warning = parsed.warnings[0]
    assert said in warning and "a shell that sources it" in warning
    assert warning.startswith("line") and "read differently" in warning


def test_env_file_forms_every_reader_agrees_on_give_no_warning():
    text = "# comment\n\n  KEY=triton\nexport\tB=1\nexport C='a b'\nD=\nE=x=y\nset -a\nF=a#b\n"
    parsed = parse_env_file(text)
    assert dict(parsed) == {"KEY": "triton", "B": "1", "C": "a b", "D": "", "E": "x=y", "F": "a#b"}
    assert parsed.warnings == []  # `export` lines: a shell's file (docker would refuse it)


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
@pytest.mark.parametrize("text", [t for t, _, _ in READ_DIFFERENTLY if "$" not in t])
def test_env_file_reading_is_what_a_shell_that_sources_it_exports(tmp_path, text):
    path = tmp_path / "svc.env"
    path.write_text(text, newline="")
    shown = "import json, os; print(json.dumps({k: os.environ.get(k) for k in 'KEY A B'.split()}))"
    done = subprocess.run(
        ["sh", "-c", 'set -a; . "$1"; exec "$2" -c "$3"', "sh", str(path), sys.executable, shown],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
        check=True,
    )
    got = {k: v for k, v in json.loads(done.stdout).items() if v is not None}
    assert got == dict(parse_env_file(text))


def test_render_rewrites_a_continued_line_whole_and_keeps_what_it_does_not_manage():
    managed = {"SGLANG_SM120_MMA_FLASHMLA", "SGLANG_SM120_FLASHMLA_BACKEND"}
    # The continued line is one: no `ton` left behind for a shell to run as a command.
    text = "SGLANG_SM120_MMA_FLASHMLA=tri\\\nton\nB=1\n"
    assert render(text, managed, MMA) == (
        "SGLANG_SM120_MMA_FLASHMLA=1\nB=1\nSGLANG_SM120_FLASHMLA_BACKEND=triton\n"
    )
    # An `unset` of a managed key is that key's line: it would undo the variant's value.
    assert render(
        "SGLANG_SM120_MMA_FLASHMLA=0\nunset SGLANG_SM120_MMA_FLASHMLA\n", managed, MMA
    ) == ("SGLANG_SM120_MMA_FLASHMLA=1\nSGLANG_SM120_FLASHMLA_BACKEND=triton\n")
    # A line continued into one that looks like a managed key's is another key's value.
    kept = "OTHER=a\\\nSGLANG_SM120_MMA_FLASHMLA=0\nexport X=1\n"
    assert render(kept, managed, MMA).startswith(kept)
    # A line that sets a managed key and another: rewriting it would change the other.
    for text in (
        "export SGLANG_SM120_MMA_FLASHMLA=0 B=1\n",
        "OTHER=a\\\nSGLANG_SM120_MMA_FLASHMLA=0\n",
    ):
        with pytest.raises(RefusedError, match="line"):
            render(text, managed, MMA)
    # A last line that a shell would join with an added one.
    with pytest.raises(RefusedError, match="a shell that sources it"):
        render("A=1\\", managed, MMA)


def test_env_file_edit_restores_a_continued_managed_line(tmp_path):
    path = tmp_path / "svc.env"
    original = "A=1\nSGLANG_SM120_MMA_FLASHMLA=\\\n0\nunset SGLANG_SM120_FLASHMLA_BACKEND\nZ=2\n"
    path.write_text(original)
    edit = EnvFileEdit(LocalTransport(_host(tmp_path)), str(path), MMA)
    assert edit.apply(MMA) == (  # the `unset` line was the backend's: set there now
        "A=1\nSGLANG_SM120_MMA_FLASHMLA=1\nSGLANG_SM120_FLASHMLA_BACKEND=triton\nZ=2\n"
    )
    path.write_text(path.read_text() + "NEW=1\n")  # someone else's edit meanwhile
    edit.restore()
    assert path.read_text() == (
        "A=1\nZ=2\nNEW=1\nSGLANG_SM120_MMA_FLASHMLA=\\\n0\nunset SGLANG_SM120_FLASHMLA_BACKEND\n"
    )


def test_an_ab_shows_the_env_file_lines_read_differently_before_it_refuses(tmp_path, monkeypatch):
    from kerneldev.bench import ab_kernels

    env = tmp_path / "svc.env"
    env.write_text("SGLANG_SM120_FLASHMLA_BACKEND=triton # pinned\n")
    host = _host(tmp_path, restart="true", health="true", env_file=str(env), variants=_SIMT_MMA)
    seen: list[dict] = []
    monkeypatch.setattr(
        ab_kernels, "kernels_of", lambda t, h, envs: seen.extend(envs) or [("flashinfer", "")] * 2
    )
    said: list[str] = []
    with pytest.raises(ab_kernels.SameKernelError):
        with ab_kernels.ab_session(LocalTransport(host), host, ["simt", "mma"], said.append):
            pass
    assert seen[0]["SGLANG_SM120_FLASHMLA_BACKEND"] == "triton"  # the shell's reading
    assert any(
        line.startswith(f"warning: {env}: line 1") and "'triton # pinned'" in line for line in said
    ), said
    assert ab_kernels.preflight(
        LocalTransport(host), host, ["simt", "mma"], allow_same=True
    ).warnings


_SIMT_MMA = {"simt": {"SGLANG_SM120_MMA_FLASHMLA": "0"}, "mma": {"SGLANG_SM120_MMA_FLASHMLA": "1"}}


def _host(tmp_path: Path, **service) -> HostConfig:
    return local_host(
        tmp_path,
        tmp_path / "ws",
        files=("x.py",),
        python=sys.executable,
        service=ServiceConfig(**service) if service else None,
    )


def test_env_file_restored_and_service_restarted_after_a_failed_restart(tmp_path):
    env = tmp_path / "svc.env"
    env.write_text("SGLANG_SM120_MMA_FLASHMLA=0\n")
    log = tmp_path / "restarts.log"
    # The restart fails while the env file asks for mma (a broken variant), works otherwise.
    restart = f"cat {env} >> {log}; ! grep -q SGLANG_SM120_MMA_FLASHMLA=1 {env}"
    host = _host(
        tmp_path,
        restart=restart,
        health="true",
        env_file=str(env),
        variants={"simt": SIMT, "mma": MMA},
        url="http://127.0.0.1:9",
    )
    request = sb.ServiceBenchRequest(["mma", "simt"], [1], requests=1, rounds=1)
    with pytest.raises(ServiceError, match="exited 1"):
        sb.run_service_bench(LocalTransport(host), host, request, results_dir=tmp_path / "r")
    assert env.read_text() == "SGLANG_SM120_MMA_FLASHMLA=0\n"
    restarts = log.read_text().splitlines()
    # Two restarts: the failed one on mma, then one on the original settings.
    assert restarts[-1] == "SGLANG_SM120_MMA_FLASHMLA=0" and len(restarts) >= 2
    assert not (tmp_path / "r").exists()  # no result saved for a failed run


def test_second_interrupt_skips_the_restart_and_names_the_command(tmp_path):
    env = tmp_path / "svc.env"
    env.write_text("")
    host = _host(tmp_path, restart="true", health="true", env_file=str(env), variants={"m": MMA})
    switcher = VariantSwitcher(LocalTransport(host), host)
    switcher.switch("m")
    import kerneldev.service.restart as service_mod

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    original = service_mod.restart
    service_mod.restart = interrupted
    try:
        with pytest.raises(ServiceError, match="not restarted") as err:
            switcher.restore()
    finally:
        service_mod.restart = original
    assert err.value.hint == "run `kerneldev restart --host h`"
    assert int(err.value.exit_code) == 130
    assert not env.exists() or env.read_text() == ""  # restored before the restart


def _ctrl_c_during_a_variant(tmp_path: Path, restart: str) -> tuple[Path, pytest.ExceptionInfo]:
    """Switch to mma, then Ctrl-C as the CLI sees it (deferred signals, a safe point)."""
    env = tmp_path / "svc.env"
    env.write_text("# mine\nSGLANG_SM120_MMA_FLASHMLA=0\n")
    host = _host(tmp_path, restart=restart, health="true", env_file=str(env), variants={"mma": MMA})
    with pytest.raises(KerneldevError) as err:
        with interrupt.deferred_signals():
            with VariantSwitcher(LocalTransport(host), host) as switcher:
                switcher.switch("mma")
                os.kill(os.getpid(), signal.SIGINT)
                interrupt.check()
    return env, err


def test_ctrl_c_restores_the_env_file_and_restarts_on_the_original_settings(tmp_path):
    log = tmp_path / "restarts.log"
    env, err = _ctrl_c_during_a_variant(tmp_path, f"cat {tmp_path / 'svc.env'} >> {log}")
    assert isinstance(err.value, interrupt.Interrupted) and int(err.value.exit_code) == 130
    assert env.read_text() == "# mine\nSGLANG_SM120_MMA_FLASHMLA=0\n"
    restarts = log.read_text().splitlines()
    # The restart on mma, then one on the original settings although Ctrl-C is pending.
    assert "SGLANG_SM120_MMA_FLASHMLA=1" in restarts
    assert restarts[-1] == "SGLANG_SM120_MMA_FLASHMLA=0"


def test_a_second_ctrl_c_skips_the_restart_on_the_original_settings(tmp_path):
    env_path = tmp_path / "svc.env"
    # The restart on the original settings gets a second Ctrl-C while it runs.
    second = f"kill -INT {os.getpid()}; sleep 20"
    restart = f"if grep -q MMA_FLASHMLA=0 {env_path}; then {second}; fi"
    env, err = _ctrl_c_during_a_variant(tmp_path, restart)
    assert isinstance(err.value, RestartSkippedError), err.value
    assert err.value.hint == "run `kerneldev restart --host h`"
    assert int(err.value.exit_code) == 130
    assert env.read_text() == "# mine\nSGLANG_SM120_MMA_FLASHMLA=0\n"  # restored first


def test_an_unhealthy_variant_shows_the_service_logs_it_points_to(tmp_path, isolated_home):
    from tests.test_loop_cmd import kd

    service = {
        "restart": "true",
        "health": "false",
        "timeout": 0.5,
        "logs": "echo engine failed: LOG-LINE-42",
        "env_file": str(tmp_path / "svc.env"),
        "url": "http://127.0.0.1:9",
        "variants": {"mma": MMA},
    }
    entry = {"transport": "local", "root": str(tmp_path), "files": ["x.py"], "workspace": "ws"}
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump({"hosts": {"h": {**entry, "service": service}}}))
    for command in (["bench", "--service", "--requests", "1", "--rounds", "1"], ["profile"]):
        run = kd("--config", str(config), *command, "--variants", "mma", "--concurrency", "1")
        assert run.exit_code == 1, run.stderr
        assert "the service logs are shown above" in run.stderr
        assert "LOG-LINE-42" in run.stderr, run.stderr  # ... and they are


def test_variants_are_checked_before_connecting(tmp_path):
    host = _host(tmp_path, restart="true", health="true", variants={"simt": SIMT})
    with pytest.raises(UsageError, match="env_file"):
        check_variants(host, ["simt"])
    host = _host(tmp_path, restart="true", health="true", variants={"simt": SIMT}, env_file="/e")
    with pytest.raises(UsageError, match="unknown variant.*mma"):
        check_variants(host, ["simt", "mma"])
    with pytest.raises(UsageError, match="no service URL"):
        check_variants(host, ["simt"])  # health is a command: no URL can be derived
    svc = ServiceConfig(restart="r", health="http://127.0.0.1:30000/health")
    assert service_url(svc, "h") == "http://127.0.0.1:30000"


def _bench_main(config: Path, *args: str) -> tuple[int, str, str]:
    """`kerneldev --config CONFIG ARGS` in this process: (exit code, stdout, stderr)."""
    import io

    from kerneldev.cli.environment import Environment
    from kerneldev.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    code = main(["--config", str(config), *args], env=Environment(stdout=out, stderr=err))
    return int(code), out.getvalue(), err.getvalue()


def _bench_config(tmp_path: Path) -> tuple[Path, Path]:
    """hosts.yaml with one local host whose service would log each restart to the returned
    file: a refused command line must leave that file absent (and write nothing else)."""
    restarts = tmp_path / "restarts.log"
    service = {
        "restart": f"echo restarted >> '{restarts}'",
        "health": "true",
        "url": "http://127.0.0.1:9",
        "env_file": str(tmp_path / "svc.env"),
        "variants": {"simt": SIMT, "mma": MMA},
    }
    entry = {"transport": "local", "root": str(tmp_path), "files": ["x.py"], "workspace": "ws"}
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump({"hosts": {"h": {**entry, "service": service}}}))
    return config, restarts


SERVICE_ONLY_OPTIONS = (
    ("--concurrency", "1"),
    ("--requests", "1"),
    ("--input-len", "8"),
    ("--max-new-tokens", "2"),
    ("--rounds", "1"),
    ("--warmup", "0"),
    ("--allow-same-kernel",),
)
KERNEL_ONLY_OPTIONS = (
    ("--shapes", "smoke"),
    ("--source", "live"),
    ("--compare", "old.json"),
    ("--gpu", "0"),
    ("--cpu",),
    ("--rotate", "1"),
)


def test_a_service_option_without_service_exits_2_naming_it(tmp_path):
    config, restarts = _bench_config(tmp_path)
    for option in SERVICE_ONLY_OPTIONS:
        code, out, err = _bench_main(config, "bench", "--cpu", *option)
        assert code == 2, (option, out, err)
        assert f"error: {option[0]} applies only with --service" in err, err
        assert "add --service" in err and "Traceback" not in err
        assert out == ""
    code, out, err = _bench_main(config, "bench", "--rounds", "3", "--warmup", "1", "--json")
    assert code == 2, err
    assert json.loads(out) == {  # as every usage error reports under --json
        "error": {
            "code": 2,
            "type": "UsageError",
            "message": "--rounds, --warmup apply only with --service",
            "hint": "add --service to time the running service, or drop them",
        }
    }
    assert not restarts.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yaml"]  # nothing ran, no result


def test_a_concurrency_level_given_twice_exits_2_before_anything_runs(tmp_path):
    """`--concurrency 1,1` ran the level twice, duplicated its results and turned the "one
    round" verdict into better/worse; refused as `--variants simt,simt` is."""
    config, restarts = _bench_config(tmp_path)
    for levels, named in (("1,1", "1"), ("4,1,4,2,1", "1, 4"), (" 2, 2", "2")):
        code, out, err = _bench_main(config, "bench", "--service", "--concurrency", levels)
        assert code == 2, (levels, out, err)
        assert f"error: --concurrency names a level twice: {named} " in err, err
        assert "--rounds N repeats every level" in err and out == ""
    assert sb.parse_concurrency("1,16,64") == [1, 16, 64]
    assert not restarts.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yaml"]  # nothing ran


def test_a_kernel_bench_option_with_service_exits_2_naming_it(tmp_path):
    config, restarts = _bench_config(tmp_path)
    for option in KERNEL_ONLY_OPTIONS:
        code, out, err = _bench_main(
            config, "bench", "--service", "--variants", "simt,mma", "--rounds", "1", *option
        )
        assert code == 2, (option, out, err)
        assert f"error: {option[0]} applies only without --service" in err, err
        assert "Traceback" not in err and out == ""
    code, out, err = _bench_main(config, "bench", "--service", "--cpu", "--shapes", "x", "--json")
    assert code == 2, err
    error = json.loads(out)["error"]
    assert error["type"] == "UsageError" and error["code"] == 2
    assert error["message"] == "--shapes, --cpu apply only without --service (to the kernel bench)"
    assert not restarts.exists()  # refused before the service or its env file was touched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yaml"]


def test_config_reads_service_variants_env_file_and_url(tmp_path):
    cfg = tmp_path / "hosts.yaml"
    base = {
        "transport": "local",
        "root": "/srv",
        "files": ["a.py"],
        "workspace": "ws",
        "service": {
            "restart": "true",
            "env_file": "/etc/sglang.env",
            "url": "http://127.0.0.1:30000/",
            "variants": {"mma": {"SGLANG_SM120_MMA_FLASHMLA": 1}, "fi": {}},
        },
    }
    cfg.write_text(yaml.safe_dump({"hosts": {"h": base}}))
    svc = load_config(cfg).host("h").service
    assert svc.variants == {"mma": {"SGLANG_SM120_MMA_FLASHMLA": "1"}, "fi": {}}
    assert svc.env_file == "/etc/sglang.env" and svc.url == "http://127.0.0.1:30000"
    base["service"]["env_file"] = "relative.env"
    cfg.write_text(yaml.safe_dump({"hosts": {"h": base}}))
    with pytest.raises(ConfigError, match=r"hosts\.h\.service\.env_file: must be an absolute"):
        load_config(cfg)
    base["service"]["env_file"] = "/e"
    base["service"]["variants"] = {"mma": {"1BAD": "x"}}
    cfg.write_text(yaml.safe_dump({"hosts": {"h": base}}))
    with pytest.raises(ConfigError, match=r":\d+: hosts\.h\.service\.variants\.mma\.1BAD"):
        load_config(cfg)


# --- metrics and verdicts -----------------------------------------------------------------


def test_metrics_follow_bench_serving_definitions():
    reqs = [
        {"ok": True, "ttft": 0.1, "itl": [0.02, 0.04], "e2e": 0.16, "output_tokens": 3},
        {"ok": True, "ttft": 0.3, "itl": [], "e2e": 0.3, "output_tokens": 1},
        {"ok": False, "ttft": None, "itl": [], "e2e": None, "output_tokens": 0},
    ]
    m = sb.level_metrics(reqs, duration=2.0)
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    # TPOT leaves out the first token and requests with one token: (160 - 100) / 2.
    assert m["median_tpot_ms"] == pytest.approx(30.0) and m["p99_tpot_ms"] == pytest.approx(30.0)
    assert m["mean_itl_ms"] == pytest.approx(30.0)
    assert m["output_throughput"] == pytest.approx(2.0) and m["request_throughput"] == 1.0
    assert sb.percentile([1, 2, 3, 4], 50) == 2.5 and sb.percentile([], 50) is None


def _load_module():
    """service_load.py as the host runs it: a standalone file, stdlib only."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "service_load_under_test", ROOT / "kerneldev" / "hostside" / "service_load.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_itl_is_per_token_and_empty_chunks_are_skipped():
    """SGLang's client: a chunk of n new tokens after a gap g counts g/n, n times; a chunk with
    no text, or no new token, adds nothing; token counts are the server's meta_info."""
    sl = _load_module()
    timer = sl.StreamTimer(start=0.0)

    def chunk(text, tokens, prompt=7):
        return {"text": text, "meta_info": {"completion_tokens": tokens, "prompt_tokens": prompt}}

    timer.chunk(chunk("a b", 2), 0.10)  # first chunk: TTFT, no ITL
    timer.chunk({"text": "", "meta_info": {}}, 0.12)  # empty: skipped
    timer.chunk(chunk("a b c d e", 5), 0.16)  # 3 new tokens in 60 ms
    timer.chunk(chunk("a b c d e", 5), 0.18)  # no new token: skipped
    timer.chunk(chunk("a b c d e f", 6), 0.20)  # 1 new token, 40 ms after the last counted
    assert timer.ttft == pytest.approx(0.10)
    assert timer.itl == pytest.approx([0.02, 0.02, 0.02, 0.04])
    assert timer.output_tokens == 6 and timer.prompt_tokens == 7


def test_errors_inside_the_stream_carry_the_servers_message():
    sl = _load_module()
    assert sl.stream_error({"error": {"message": "context too long", "code": 400}}) == (
        "context too long"
    )
    abort = {"text": "x", "meta_info": {"finish_reason": {"type": "abort", "message": "OOM"}}}
    assert sl.stream_error(abort) == "aborted by the server: OOM"
    length = {"text": "x", "meta_info": {"finish_reason": {"type": "length"}}}
    assert sl.stream_error(length) is None
    assert sl._server_message('{"error": {"message": "bad"}}') == "bad"
    assert sl._server_message('{"object": "error", "message": "worse"}') == "worse"
    m = sb.level_metrics(
        [
            {"ok": False, "error": "the server reported: OOM"},
            {"ok": False, "error": "the server reported: OOM"},
            {"ok": False, "error": "HTTP 400: bad"},
        ],
        duration=1.0,
    )
    assert m["failed"] == 3 and m["errors"] == [
        {"message": "the server reported: OOM", "requests": 2},
        {"message": "HTTP 400: bad", "requests": 1},
    ]


def test_prompts_share_no_prefix_and_repeat_for_every_variant():
    sl = _load_module()
    batch = sl.prompts(500, 16, seed=3)
    assert len({p[0] for p in batch}) == 500 and all(len(p) == 16 for p in batch)
    assert all(sl.PROMPT_ID_LOW <= t < sl.PROMPT_ID_HIGH for p in batch for t in p)
    assert sl.prompts(500, 16, seed=3) == batch and sl.prompts(500, 16, seed=4) != batch


def test_server_settings_that_differ_between_variants_are_named():
    servers = [
        {"round": 0, "variant": "a", "source": "/server_info",
         "settings": {"tp_size": 1, "cuda_graph_max_bs": 128},
         "kerneldev": {"kernel_variant": "simt"}},
        {"round": 0, "variant": "b", "source": "/server_info",
         "settings": {"tp_size": 1, "cuda_graph_max_bs": None},
         "kerneldev": {"kernel_variant": "mma"}},
        {"round": 1, "variant": "b", "source": "/server_info",
         "settings": {"tp_size": 2, "cuda_graph_max_bs": None},
         "kerneldev": {"kernel_variant": "mma"}},
    ]  # fmt: skip
    data: dict = {}
    sb.add_server_settings(data, servers)
    # The kernel variant is the A/B itself; the graph size and TP are not.
    assert data["server_differences"] == [
        {"setting": "cuda_graph_max_bs", "values": {"a": 128, "b": None}},
    ]
    assert data["server"]["b"]["changed_between_rounds"] == ["tp_size"]
    from kerneldev.cli.commands.service_bench import server_difference_lines

    lines = server_difference_lines(data)
    assert lines[0] == "server setting differs between variants: cuda_graph_max_bs: a=128, b=None"
    assert "tp_size" in lines[1]


def test_verdict_is_no_change_within_the_spread_across_rounds():
    assert sb.verdict("median_tpot_ms", [10, 12], [11, 13]) == sb.NO_CHANGE
    assert sb.verdict("median_tpot_ms", [10, 12], [7, 8]) == sb.BETTER
    assert sb.verdict("median_tpot_ms", [10, 12], [13, 14]) == sb.WORSE
    assert sb.verdict("output_throughput", [10, 12], [13, 14]) == sb.BETTER
    assert sb.verdict("median_tpot_ms", [10], [20]) == sb.ONE_ROUND
    assert sb.round_order(["a", "b"], 3) == [
        (0, "a"),
        (0, "b"),
        (1, "b"),
        (1, "a"),
        (2, "a"),
        (2, "b"),
    ]


# --- the trace summary --------------------------------------------------------------------


def test_trace_summary_streams_a_gzipped_trace(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": "_mma_split_kernel", "dur": 30.0}] * 3
    events += [
        {"ph": "X", "cat": "kernel", "name": "_combine_kernel", "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "nvjet_tst_128x64_gemm", "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 1000},
        {"ph": "i", "cat": "kernel", "name": "ignored"},
    ]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms"}, f, indent=1)
    assert sum(1 for _ in trace_summary.iter_events(str(path), chunk=5)) == len(events)
    s = trace_summary.summarise(str(path), top=2)
    assert s["time_kind"] == "gpu" and s["total_ms"] == pytest.approx(0.12)
    assert [(r["name"], r["family"], r["calls"]) for r in s["top"]] == [
        ("_mma_split_kernel", trace_summary.ATTENTION, 3),
        ("nvjet_tst_128x64_gemm", trace_summary.GEMM, 1),
    ]
    assert s["top"][0]["share"] == pytest.approx(0.75) and s["top"][0]["mean_us"] == 30.0
    fams = {f["family"]: f["share"] for f in s["families"]}
    assert fams[trace_summary.ATTN_KERNELDEV] == pytest.approx(100 / 120)  # with its combine
    truncated = tmp_path / "cut.json"
    truncated.write_text(path.read_bytes() and gzip.open(path, "rt").read()[:-40])
    with pytest.raises(ValueError, match="middle of an event"):
        trace_summary.summarise(str(truncated))


@pytest.mark.parametrize(
    "name,expected",
    [
        # FlashInfer's sm_120 sparse MLA (SGLang 0.5.23's default on sm_120)
        ("void sparse_mla_decode_dsv4_kernel<64, 512, 64>(Params)", trace_summary.ATTN_FLASHINFER),
        ("sparse_mla_decode_dsv4_merge_kernel", trace_summary.ATTN_FLASHINFER),
        # FlashMLA's (SGLang on sm_90/sm_100)
        (
            "void flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla>",
            trace_summary.ATTN_FLASHMLA,
        ),
        (
            "void flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512>",
            trace_summary.ATTN_FLASHMLA,
        ),
        # SGLang's own Triton kernel file (0.5.14 and 0.5.23)
        ("_tiled_sparse_decode_kernel", trace_summary.ATTN_SGLANG_TRITON),
        # kerneldev's bundled kernels
        ("_mma_split_kernel", trace_summary.ATTN_KERNELDEV),
        ("_simt_decode_kernel", trace_summary.ATTN_KERNELDEV),
        ("_combine_kernel", trace_summary.ATTN_KERNELDEV),
        ("nvjet_tst_128x64_gemm", trace_summary.GEMM),
    ],
)
def test_kernel_families_name_who_wrote_the_attention_kernel(name, expected):
    assert trace_summary.family(name) == expected


def test_a_profile_records_which_attention_kernel_ran():
    from kerneldev.bench.profile import attention_of

    families = [
        {"family": trace_summary.ATTN_FLASHINFER, "total_ms": 3.0, "share": 0.3},
        {"family": trace_summary.GEMM, "total_ms": 6.0, "share": 0.6},
        {"family": trace_summary.ATTN_SGLANG_TRITON, "total_ms": 1.0, "share": 0.1},
    ]
    share, ran = attention_of({"families": families})
    assert ran == trace_summary.ATTN_FLASHINFER and share == pytest.approx(0.4)
    assert attention_of({"families": families[1:2]}) == (None, None)


# --- end to end against the sandbox -------------------------------------------------------

needs_service = pytest.mark.skipif(
    not decode_service_available(), reason="needs fastapi, uvicorn, torch and triton"
)
SMALL = ["--concurrency", "1,2", "--requests", "2", "--input-len", "4"]
SMALL += ["--max-new-tokens", "3", "--rounds", "1", "--json"]


def _kerneldev(config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"KERNELDEV_SSH_CONFIG": "none"}
    return run_kerneldev("--config", str(config), *args, env=env, timeout=300)


def _check_bench_and_profile(box, config: Path, variants: list[str]) -> None:
    env_before = (box.service_dir / "service.env").read_bytes()
    args = [*SMALL, "--variants", ",".join(variants)]
    bench = _kerneldev(config, "bench", "--service", *args)
    assert bench.returncode == 0, bench.stderr[-3000:]
    report = json.loads(bench.stdout)
    data = report["result"]
    assert data["schema"] == sb.SCHEMA and data["ok"]
    assert [(r["variant"], r["concurrency"]) for r in data["results"]] == [
        (v, c) for v in variants for c in (1, 2)
    ]
    for r in data["results"]:
        assert r["metrics"]["completed"] == 2 and r["metrics"]["total_output"] == 6
        assert r["metrics"]["median_tpot_ms"] > 0 and r["metrics"]["output_throughput"] > 0
    if len(variants) > 1:
        assert {ab["concurrency"] for ab in data["ab"]} == {1, 2}
        assert data["ab"][0]["metrics"]["median_tpot_ms"]["verdict"] == sb.ONE_ROUND
    saved = Path(report["saved_to"])
    assert saved.parent == config.parent / ".kerneldev" / "results" and saved.is_file()

    # 6 steps: 4 decode steps profiled, so attention (~16 ms a step under the interpreter)
    # stays on top of the ~0.3 ms GEMM even when a loaded CI host stalls one host-timed range
    # (with one decode step, a stalled o_proj range once came out on top).
    prof = _kerneldev(
        config, "profile", "--variants", ",".join(variants), "--concurrency", "2", "--steps", "6",
        "--top", "5", "--json",
    )  # fmt: skip
    assert prof.returncode == 0, prof.stderr[-3000:]
    result = json.loads(prof.stdout)
    assert result["time_kind"] == "cpu"
    assert [v["variant"] for v in result["variants"]] == variants
    for v in result["variants"]:
        top = v["summary"]["top"][0]
        assert top["name"] == "sparse_decode_attention" and top["family"] == trace_summary.ATTENTION
        assert 0 < v["attention_share"] <= 1
        assert v["attention_kernel"] == trace_summary.ATTN_KERNELDEV
        assert v["decode_only"] is True and "-DECODE" in v["trace_on_host"]  # staged profile
        # the probe's answer (an A/B only: one variant is no comparison)
        probed = f"triton ({v['variant']})" if len(variants) > 1 else None
        assert v["dispatch_kernel"] == probed, v
        local = Path(v["local_trace"])
        assert local.is_file() and local.is_relative_to(config.parent / ".kerneldev" / "profiles")
    # The service is back on the original settings with the env file as it was.
    assert (box.service_dir / "service.env").read_bytes() == env_before
    log = (box.service_dir / "service.log").read_text()
    # The last start (on the original settings: no variable set) runs the SIMT default.
    assert "engine ready: variant=simt" in log.split("sandbox decode service on")[-1]


@pytest.fixture(scope="module")
def ssh_box(tmp_path_factory):
    if not decode_service_available():
        pytest.skip("needs fastapi, uvicorn, torch and triton")
    if find_sshd() is None or shutil.which("ssh-keygen") is None:
        pytest.skip("sshd is not installed")
    box = create_sandbox(tmp_path_factory.mktemp("sbx"), use_ssh=True, decode_service=True)
    try:
        yield box
    finally:
        box.close()


@needs_service
@pytest.mark.ssh
def test_bench_service_and_profile_over_ssh(ssh_box):
    _check_bench_and_profile(ssh_box, ssh_box.config_path, ["simt", "mma"])


@needs_service
def test_bench_service_and_profile_on_the_local_transport(ssh_box, tmp_path):
    """The same sandbox reached through the local transport (the engineer on the GPU box);
    one variant, to keep CI short (the ssh test runs the A/B)."""
    _check_bench_and_profile(ssh_box, _local_config(ssh_box, tmp_path), ["mma"])


def _local_config(box, tmp_path: Path) -> Path:
    """hosts.yaml in `tmp_path` reaching the sandbox `box` through the local transport."""
    data = yaml.safe_load(box.config_path.read_text())
    entry = data["hosts"][box.host_name]
    for key in ("hostname", "port", "user", "identity_file", "known_hosts"):
        entry.pop(key, None)
    entry["transport"] = "local"
    entry["workspace"] = str(box.workspace)
    entry["mirror"] = str(box.mirror)
    config = tmp_path / "hosts.yaml"
    config.write_text(yaml.safe_dump(data))
    return config


@needs_service
def test_a_profile_that_cannot_be_saved_is_still_printed_then_an_error(ssh_box, tmp_path):
    """`.kerneldev` is a file: the traces cannot be copied nor the profile saved, and the
    finished profile is shown (the table; in --json the report with an `error` object) before
    the error (it was lost: the error alone)."""
    config = _local_config(ssh_box, tmp_path)
    (tmp_path / ".kerneldev").touch()
    args = ["profile", "--variants", "mma", "--concurrency", "1", "--steps", "2", "--top", "3"]
    proc = _kerneldev(config, *args, "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert [v["variant"] for v in report["variants"]] == ["mma"]
    assert report["saved_to"] is None
    assert report["error"]["message"].startswith("cannot write ")
    assert report["error"]["message"] == report["save_error"]
    proc = _kerneldev(config, *args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "mma" in proc.stdout and "kerneldev: error: cannot write " in proc.stderr


@needs_service
def test_an_ab_whose_later_variant_never_gets_healthy_keeps_what_it_measured(ssh_box, tmp_path):
    """The first variant is measured, the second one's restart fails: the error says so and
    where the measured rounds went, saved as a result marked incomplete (they were dropped)."""
    config = _local_config(ssh_box, tmp_path)
    data = yaml.safe_load(config.read_text())
    svc = data["hosts"][ssh_box.host_name]["service"]
    broken = f"if grep -q KD_TEST_BROKEN=1 {svc['env_file']}; then exit 1; fi; "
    svc["restart"] = broken + svc["restart"]
    svc["variants"]["broken"] = {"KD_TEST_BROKEN": "1"}
    config.write_text(yaml.safe_dump(data))
    args = ["bench", "--service", "--variants", "mma,broken", "--concurrency", "1"]
    args += ["--requests", "1", "--input-len", "4", "--max-new-tokens", "2", "--rounds", "1"]
    proc = _kerneldev(config, *args, "--warmup", "0", "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    saved = list((tmp_path / ".kerneldev" / "results").glob("*-service.json"))
    assert len(saved) == 1, saved
    error = json.loads(proc.stdout)["error"]
    assert "exited 1" in error["message"]
    assert f"saved as an incomplete result: {saved[0]}" in error["hint"]
    result = json.loads(saved[0].read_text())
    assert result["complete"] is False and result["ok"] is False
    assert result["stopped_by"] == error["message"]
    assert [(r["variant"], r["rounds"]) for r in result["results"]] == [("mma", 1), ("broken", 0)]
    assert result["results"][0]["metrics"]["completed"] == 1
    assert result["ab"][0]["metrics"]["median_tpot_ms"]["verdict"] == "n/a"


@needs_service
def test_a_service_result_that_cannot_be_saved_is_still_printed_then_an_error(ssh_box, tmp_path):
    """`.kerneldev` is a file, so the results folder cannot be made: the finished A/B is not
    lost (the JSON has the result and an `error` object; the table comes before the error)."""
    config = _local_config(ssh_box, tmp_path)
    (tmp_path / ".kerneldev").touch()
    args = ["bench", "--service", "--variants", "mma", "--concurrency", "1", "--requests", "1"]
    args += ["--input-len", "4", "--max-new-tokens", "2", "--rounds", "1", "--warmup", "0"]
    results = tmp_path / ".kerneldev" / "results"
    proc = _kerneldev(config, *args, "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert report["result"]["ok"] and report["saved_to"] is None
    assert report["error"]["message"].startswith(f"cannot save the result to {results}: ")
    assert f"kerneldev: error: cannot save the result to {results}: " in proc.stderr

    proc = _kerneldev(config, *args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "service decode timings" in proc.stdout and "mma" in proc.stdout  # the table
    assert f"kerneldev: error: cannot save the result to {results}: " in proc.stderr


def test_the_hosts_temporary_folders_go_although_ctrl_c_is_pending(tmp_path, monkeypatch):
    """Removing them runs `rm -rf` on the host (Transport.remove's default, as over SSH and the
    agent), which a pending Ctrl-C stops at once unless the clean-up is shielded."""
    from kerneldev.bench.profile import TraceFolders
    from kerneldev.hosts.transport.base import Transport
    from kerneldev.service.variants import HostScripts

    class RmOnTheHost(LocalTransport):
        remove = Transport.remove

    host_tmp = tmp_path / "host-tmp"
    host_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(host_tmp))
    host = _host(tmp_path, restart="true", health="true", url="http://127.0.0.1:9")
    transport = RmOnTheHost(host)
    with pytest.raises(interrupt.Interrupted):
        with interrupt.deferred_signals():
            with HostScripts(transport, host) as scripts, TraceFolders(transport, host) as traces:
                traces.folder("mma")
                assert sorted(p.name.split(".")[0] for p in host_tmp.iterdir()) == [
                    "kerneldev-service",
                    "kerneldev-traces",
                ]
                assert scripts.dir
                os.kill(os.getpid(), signal.SIGINT)
                interrupt.check()
    assert list(host_tmp.iterdir()) == []


@pytest.mark.ssh
@pytest.mark.parametrize("command", ["bench --service", "profile"])
def test_ctrl_c_removes_the_hosts_temporary_folders(command, sshd_server, tmp_path, isolated_home):
    """Ctrl-C while the load generator runs: the scripts' folder (kerneldev-service.*) and
    profile's trace folder (kerneldev-traces.*) on the host are removed, as the kernel bench's
    is. The host's `python` is a wrapper that records where it runs and then hangs."""
    from tests.clirun import start_kerneldev
    from tests.test_bench import write_config
    from tests.test_reliability import _wait_for

    marker = tmp_path / "load-started"
    wrapper = tmp_path / "python-for-this-test"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$1" in */service_load.py) echo "$PWD $*" > "{marker}"; exec sleep 60;; esac\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    env_file = tmp_path / "svc.env"
    env_file.write_text("SGLANG_SM120_MMA_FLASHMLA=0\n")
    service = {
        "restart": "true",
        "health": "true",
        "env_file": str(env_file),
        "url": "http://127.0.0.1:9",
        "variants": {"mma": MMA},
    }
    config = write_config(tmp_path, "ssh", sshd_server, python=str(wrapper), service=service)
    proc = start_kerneldev("--config", str(config), *command.split(), "--variants", "mma")
    try:
        assert _wait_for(marker.exists, 120), proc.stderr.read() if proc.poll() else "no start"
        assert _wait_for(lambda: marker.read_text().strip(), 10)
        words = marker.read_text().split()
        folders = [Path(words[0])]  # the scripts' folder, the load generator's working folder
        if "--output-dir" in words:
            folders.append(Path(words[words.index("--output-dir") + 1]).parent)
        assert all(f.is_dir() for f in folders), folders
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert [f for f in folders if f.exists()] == []
    assert env_file.read_text() == "SGLANG_SM120_MMA_FLASHMLA=0\n"  # and restored


def test_trace_folder_is_the_env_files_or_one_any_user_can_write(tmp_path, monkeypatch):
    """profile's trace folder: SGLANG_TORCH_PROFILER_DIR of the env file when set, else a fresh
    mode-1777 folder (a server running as another user can write it), removed at the end; when
    no trace appears the error names the folder and the server's user (found with `ss` from the
    service's port: here a listener of this test, so this user)."""
    import getpass
    import socket
    import stat

    from kerneldev.bench.profile import TraceFolders
    from kerneldev.config import load_config
    from kerneldev.hosts.transport import open_transport

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    env_file = tmp_path / "sglang.env"
    env_file.write_text("A=1\n")
    config = tmp_path / "hosts.yaml"
    entry = {
        "transport": "local",
        "root": str(tmp_path),
        "files": ["x.py"],
        "workspace": "ws",
        "service": {
            "restart": "true",
            "env_file": str(env_file),
            "url": f"http://127.0.0.1:{port}",
        },
    }
    config.write_text(json.dumps({"hosts": {"h": entry}}))
    host = load_config(config).host("h")
    try:
        with open_transport(host) as transport:
            with TraceFolders(transport, host) as traces:
                folder = traces.folder("mma")
                assert stat.S_IMODE(Path(folder).parent.stat().st_mode) == 0o1777
                assert stat.S_IMODE(Path(folder).stat().st_mode) == 0o1777
                err = traces.no_trace_error("mma", folder)
            assert not Path(folder).parent.exists()
            message = " ".join(err.message.split())
            assert folder in message and f"its user {getpass.getuser()}" in message, message
            assert "SGLANG_TORCH_PROFILER_DIR" in err.hint
            env_file.write_text(f"SGLANG_TORCH_PROFILER_DIR={tmp_path / 'mine'}\n")
            with TraceFolders(transport, host) as traces:
                assert traces.folder("mma") == str(tmp_path / "mine")
                assert "SGLANG_TORCH_PROFILER_DIR" in traces.no_trace_error("mma", "x").message
    finally:
        listener.close()


def test_an_ab_waits_for_the_hosts_lock_and_touches_nothing_while_held(
    tmp_path, monkeypatch, isolated_home
):
    """bench --service and profile rewrite the env file and restart the service, so they hold
    the host's lock like `restart`: while another command holds it (here alice's, on another
    machine) they give up naming the holder (exit 1, JSON too), restarting nothing and leaving
    the env file as it was. Without it, two A/Bs at once restarted the service under each
    other's requests and left the env file on a variant's settings."""
    import io
    from dataclasses import replace

    from kerneldev.cli.commands import service_bench as service_bench_cmd
    from kerneldev.cli.environment import Environment
    from kerneldev.cli.main import main
    from kerneldev.loop import lock as host_lock

    root = tmp_path / "live"
    root.mkdir()
    env_file = tmp_path / "svc.env"
    env_file.write_text("SGLANG_SM120_MMA_FLASHMLA=0\n")
    restarts = tmp_path / "restarts.log"
    config = tmp_path / "hosts.yaml"
    service = {
        "restart": f"echo restarted >> '{restarts}'",
        "health": "http://127.0.0.1:9/health",
        "timeout": 1,
        "env_file": str(env_file),
        "variants": {"simt": SIMT, "mma": MMA},
    }
    entry = {"transport": "local", "root": str(root), "files": ["x.py"], "workspace": "ws"}
    entry.update(python=sys.executable, service=service)
    config.write_text(yaml.safe_dump({"hosts": {"h": entry}}))
    me = host_lock.HostLock(LocalTransport(), str(root), "push").me
    other = replace(me, machine="elsewhere", user="alice", token="cafe")
    (root / host_lock.LOCK_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / host_lock.LOCK_FILE).write_text(json.dumps(other.__dict__))
    monkeypatch.setattr(service_bench_cmd, "LOCK_WAIT", 0.0, raising=False)
    for args in (["bench", "--service", "--rounds", "1"], ["profile"]):
        out, err = io.StringIO(), io.StringIO()
        env = Environment(stdout=out, stderr=err, stdin=io.StringIO())
        code = main(["--config", str(config), *args, "--variants", "simt,mma", "--json"], env=env)
        assert int(code) == 1, (args, out.getvalue(), err.getvalue())
        assert "alice@elsewhere" in json.loads(out.getvalue())["error"]["message"]
        assert not restarts.exists()
        assert env_file.read_text() == "SGLANG_SM120_MMA_FLASHMLA=0\n"


def test_a_profile_whose_requests_all_fail_says_so_not_the_folder(tmp_path):
    """A server that takes /start_profile and /stop_profile but answers every /generate with
    an error (a real HTTP server on a loopback port): no trace appears, and service_load.py
    names the failed requests rather than leaving the folder's permissions to be blamed."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            failing = self.path == "/generate"
            body = b'{"error": {"message": "engine died"}}' if failing else b"{}"
            self.send_response(500 if failing else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = ROOT / "kerneldev" / "hostside" / "service_load.py"
        url = f"http://127.0.0.1:{server.server_address[1]}"
        run = subprocess.run(
            [sys.executable, str(script), "profile", "--url", url, "--concurrency", "2",
             "--output-dir", str(tmp_path / "traces"), "--trace-wait", "0.5",
             "--max-new-tokens", "4", "--out", str(tmp_path / "out.json")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert run.returncode != 0
    assert "every profiled request failed (2 of 2; the first: HTTP 500: engine died)" in (
        run.stderr
    ), run.stderr


def test_render_appends_after_a_last_line_without_its_line_end():
    """A file whose last line is one kerneldev cannot read (an expansion) and has no final
    newline: the appended variant line must not count as a change of that line."""
    text = "PYTHONPATH=/opt/x\nLD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH"
    new = render(text, ["SGLANG_SM120_MMA_FLASHMLA"], {"SGLANG_SM120_MMA_FLASHMLA": "1"})
    assert new == text + "\nSGLANG_SM120_MMA_FLASHMLA=1\n"


def test_an_assignment_before_export_or_unset_is_not_read_as_setting_nothing():
    """`A=1 export B=2` sets B in a shell (and A in some shells); `A=1 unset B` unsets B: such
    a line is one kerneldev cannot tell, and says so, not one that "sets nothing"."""
    from kerneldev.service.envfile import parse_env_file

    for line in ("FOO=1 export BAR=2\n", "BAR=3\nFOO=1 unset BAR\n"):
        got = parse_env_file(line)
        assert any("cannot tell" in w for w in got.warnings), (line, got.warnings)
