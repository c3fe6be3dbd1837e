"""The sandbox's decode service against real clients: the `openai` package, httpx, the profiler.

One sandbox (local transport) for the module: its restart script starts
`python -m kerneldev.sandbox.service` on a loopback port, which imports the live kernel file
and decodes under the Triton interpreter on tiny sizes (a step takes a few hundred ms).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from kerneldev.config import load_config
from kerneldev.hosts.transport import open_transport
from kerneldev.hostside import trace_summary
from kerneldev.sandbox.host import create_sandbox, decode_service_available
from kerneldev.sandbox.service.engine import KERNEL_RELPATH
from kerneldev.sandbox.service.scripted import SPEC_ENV
from kerneldev.service import restart as service
from kerneldev.service import server_process
from kerneldev.service.envfile import EnvFileEdit
from tests.service_start import restart_until_healthy

pytestmark = pytest.mark.skipif(
    not decode_service_available(), reason="needs fastapi, uvicorn, torch and triton"
)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

INTERVAL = 0.2  # health polling


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    sandbox = create_sandbox(tmp_path_factory.mktemp("svc"), use_ssh=False, decode_service=True)
    host = load_config(sandbox.config_path).host(sandbox.host_name)
    with open_transport(host) as transport:
        sandbox.host = host
        sandbox.transport = transport
        _, sandbox.startup_checks = restart_until_healthy(transport, host, 0.05)
        try:
            yield sandbox
        finally:
            sandbox.close()


def url(box, path: str) -> str:
    return f"{box.host.service.url}{path}"


def test_health_is_503_or_silent_while_loading_then_200(box):
    seen = box.startup_checks
    assert seen[-1] == "HTTP 200", seen
    # Before ready: nothing listening yet, or 503 while the engine loads; never another answer.
    assert set(seen[:-1]) <= {"no answer", "HTTP 503"}, seen


def test_openai_client_streams_completions(box):
    client = openai.OpenAI(base_url=url(box, "/v1"), api_key="none")
    stream = client.completions.create(
        model="sandbox", prompt="the kernel decodes", max_tokens=3, stream=True
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks]
    assert len(chunks) == 3 and all(t.startswith(" t") for t in texts), texts
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, "length"]

    done = client.completions.create(model="sandbox", prompt="a b c d", max_tokens=2)
    assert done.usage.prompt_tokens == 4
    assert done.usage.completion_tokens == 2 and done.usage.total_tokens == 6
    assert len(done.choices[0].text.split()) == 2


def test_generate_streams_sse_events_then_done(box):
    body = {"text": "one two three", "sampling_params": {"max_new_tokens": 4}, "stream": True}
    with httpx.stream("POST", url(box, "/generate"), json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = "".join(resp.iter_text())
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]", raw[-200:]
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert [p["meta_info"]["completion_tokens"] for p in payloads] == [1, 2, 3, 4]
    assert [len(p["text"].split()) for p in payloads] == [1, 2, 3, 4]  # text so far
    assert payloads[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert payloads[0]["meta_info"]["prompt_tokens"] == 3

    plain = httpx.post(
        url(box, "/generate"),
        json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
        timeout=60,
    ).json()
    assert plain["meta_info"]["prompt_tokens"] == 2 and len(plain["output_ids"]) == 2


def test_bad_request_is_400_with_a_message(box):
    resp = httpx.post(
        url(box, "/generate"), json={"text": "x", "sampling_params": {"max_new_tokens": 0}}
    )
    assert resp.status_code == 400 and "max_new_tokens" in resp.json()["message"]


def test_profile_endpoints_write_a_trace_naming_the_kernel(box, tmp_path):
    out_dir = tmp_path / "traces"
    # Starting torch's profiler can take over httpx's default 5 s on a loaded machine.
    start = httpx.post(url(box, "/start_profile"), json={"output_dir": str(out_dir)}, timeout=60)
    assert start.status_code == 200
    httpx.post(
        url(box, "/generate"),
        json={"text": "x", "sampling_params": {"max_new_tokens": 2}},
        timeout=60,
    )
    stop = httpx.post(url(box, "/stop_profile"), timeout=120)
    assert stop.status_code == 200
    traces = list(out_dir.glob("*-TP-0.trace.json.gz"))
    assert len(traces) == 1
    summary = trace_summary.summarise(str(traces[0]))
    assert summary["time_kind"] == "cpu"  # no GPU here: record_function ranges
    by_name = {r["name"]: r for r in summary["top"]}
    assert by_name["sparse_decode_attention"]["family"] == trace_summary.ATTENTION
    assert by_name["sparse_decode_attention"]["calls"] >= 2
    # Stopping twice is refused, as SGLang refuses it.
    assert httpx.post(url(box, "/stop_profile"), timeout=60).status_code == 400


def test_sglang_info_endpoints_answer_with_sglangs_field_names(box):
    """What SGLang's client and kerneldev read at start-up: /v1/models (the client's readiness
    check and default model), /model_info (its tokenizer), /server_info, /flush_cache."""
    models = httpx.get(url(box, "/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["owned_by"] == "sglang"
    name = models["data"][0]["id"]
    assert httpx.get(url(box, f"/v1/models/{name}")).json()["id"] == name
    missing = httpx.get(url(box, "/v1/models/nope"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"

    for path in ("/model_info", "/get_model_info"):
        info = httpx.get(url(box, path)).json()
        assert info["served_model_name"] == name and info["is_generation"] is True
        assert "tokenizer_path" in info

    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(url(box, path)).json()
        assert info["tp_size"] == 1 and info["speculative_algorithm"] is None
        assert info["attention_backend"] == "flashmla_sm120_triton"
        # CPU: no CUDA graphs, and the server info says so in SGLang's terms.
        assert info["disable_cuda_graph"] is True and info["cuda_graph_bs_decode"] is None
        assert info["kerneldev"]["cuda_graph"]["note"] == "no CUDA graphs on CPU"
        assert isinstance(info["internal_states"], list) and info["version"]

    flushed = httpx.post(url(box, "/flush_cache"), params={"timeout": 30}, timeout=60)
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    assert httpx.get(url(box, "/health_generate"), timeout=60).status_code == 200
    health = httpx.get(url(box, "/health"))
    assert health.status_code == 200 and health.text == ""


def _wait_until_complete(trace: Path, timeout: float = 60) -> None:
    """Until the gzipped trace reads to its end-of-stream marker and parses as JSON: the export
    is done (the 1 s pause that stood here was a guess a loaded machine can outlast)."""
    import gzip

    deadline = time.monotonic() + timeout
    while True:
        try:
            with gzip.open(trace, "rb") as f:
                json.load(f)
            return
        except (EOFError, OSError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_profile_by_step_count_traces_only_those_decode_steps(box, tmp_path):
    """SGLang's step-count profiling: start_step (at least the next step) and num_steps; the
    trace is written by itself after those steps (a later /stop_profile has nothing to stop),
    and holds exactly num_steps steps of every attention layer."""
    out_dir = tmp_path / "steps"
    body = {"output_dir": str(out_dir), "start_step": 0, "num_steps": 2, "activities": ["GPU"]}
    assert httpx.post(url(box, "/start_profile"), json=body, timeout=60).status_code == 200
    httpx.post(
        url(box, "/generate"),
        json={"text": "x", "sampling_params": {"max_new_tokens": 6}},
        timeout=60,
    )
    deadline = time.monotonic() + 60
    while not list(out_dir.glob("*-TP-0.trace.json.gz")) and time.monotonic() < deadline:
        time.sleep(0.1)
    traces = list(out_dir.glob("*-TP-0.trace.json.gz"))
    assert len(traces) == 1
    assert httpx.post(url(box, "/stop_profile"), timeout=60).status_code == 400  # stopped by itself
    _wait_until_complete(traces[0])  # the export writes the file as it goes
    summary = trace_summary.summarise(str(traces[0]))
    calls = {r["name"]: r["calls"] for r in summary["top"]}
    layers = httpx.get(url(box, "/get_server_info")).json()["kerneldev"]["sizes"]["layers"]
    assert calls["sparse_decode_attention"] == 2 * layers


def test_server_info_follows_the_env_file_across_restarts(box):
    info = httpx.get(url(box, "/get_server_info")).json()["kerneldev"]
    assert info["kernel_variant"] == "simt" and info["device"] == "cpu"
    assert info["kernel_file"].startswith(str(box.root))
    # the service process runs its decode steps with kernels/interpreter_overhead.py's trims
    assert info["interpreter_trims"] is True

    svc = box.host.service
    edit = EnvFileEdit(box.transport, svc.env_file, {"SGLANG_SM120_MMA_FLASHMLA"})
    edit.apply({"SGLANG_SM120_MMA_FLASHMLA": "1"})
    try:
        health = service.restart(box.transport, svc, interval=INTERVAL)
        assert health.healthy
        info = httpx.get(url(box, "/get_server_info")).json()["kerneldev"]
        assert info["kernel_variant"] == "mma"
        assert info["env"]["SGLANG_SM120_MMA_FLASHMLA"] == "1"
        assert info["interpreter_trims"] is True  # a restart's worker applies them too
        log = (box.service_dir / "service.log").read_text()
        assert "engine ready: variant=mma" in log
    finally:
        edit.restore()
    assert "SGLANG_SM120_MMA_FLASHMLA" not in (box.service_dir / "service.env").read_text()


def _launcher_of(box) -> str:
    """The launcher socket the running server was forked from (a worker has its launcher's
    command line), after checking that it is this sandbox's."""
    server = server_process.find(box.transport, box.host)
    assert server is not None
    words = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")
    sock = Path(words[words.index("--serve") + 1])
    assert sock.parent == box.service_dir / "launch" and sock.suffix == ".sock"
    return sock.name


def test_a_restart_through_the_launcher_is_a_new_process_on_what_was_pushed(box):
    """restart.sh starts the service through a resident launcher (launcher.py), one per
    environment: a restart is still a new process that imports the live kernel file as it is
    now and runs with the env file's values, also in /proc/<pid>/environ (what `kernels status`
    reads of the running server); a restart on the same environment reuses its launcher."""
    svc = box.host.service
    assert service.restart(box.transport, svc, interval=INTERVAL).healthy
    first = server_process.find(box.transport, box.host)
    launcher = _launcher_of(box)
    kernel = Path(box.root) / KERNEL_RELPATH
    original = kernel.read_bytes()
    edit = EnvFileEdit(box.transport, svc.env_file, {"SGLANG_SM120_MMA_FLASHMLA"})
    try:
        kernel.write_bytes(original + b"\n# pushed after the launcher started\n")
        assert service.restart(box.transport, svc, interval=INTERVAL).healthy
        assert _launcher_of(box) == launcher  # the same environment: the same launcher
        info = httpx.get(url(box, "/get_server_info")).json()["kerneldev"]
        assert info["kernel_sha256"] == hashlib.sha256(kernel.read_bytes()).hexdigest()
        second = server_process.find(box.transport, box.host)
        assert first is not None and second is not None and second.pid != first.pid

        edit.apply({"SGLANG_SM120_MMA_FLASHMLA": "1"})
        assert service.restart(box.transport, svc, interval=INTERVAL).healthy
        assert _launcher_of(box) != launcher  # another environment, another launcher
        third = server_process.find(box.transport, box.host)
        assert third is not None
        environ = server_process.environment(box.transport, third.pid)
        assert environ is not None and environ.get("SGLANG_SM120_MMA_FLASHMLA") == "1"
        assert httpx.get(url(box, "/get_server_info")).json()["kerneldev"]["kernel_variant"] == (
            "mma"
        )
    finally:
        kernel.write_bytes(original)
        edit.restore()
        assert service.restart(box.transport, svc, interval=INTERVAL).healthy


def test_the_service_stops_with_the_process_restart_sh_started(box):
    """service.pid names the launcher's client: SIGKILL on it (restart.sh's last resort)
    takes the service down with it, so the port is free for the next start."""
    svc = box.host.service
    listener = server_process.find(box.transport, box.host)  # every start here is the launcher's
    pid = int((box.service_dir / "service.pid").read_text())
    assert listener is not None and listener.pid != pid  # the worker, forked by the launcher
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while server_process.find(box.transport, box.host) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_process.find(box.transport, box.host) is None
    assert service.restart(box.transport, svc, interval=INTERVAL).healthy


def test_the_live_tree_holds_no_bytecode_after_a_restart(box, monkeypatch):
    """The service imports the live kernel file as SGLang would, but writes no __pycache__ into
    the live tree (bytes nobody pushed; a same-size push in the same second would run them),
    also when started from a shell that writes bytecode (a restart over SSH)."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    assert service.restart(box.transport, box.host.service, interval=INTERVAL).healthy
    assert sorted(Path(box.root).rglob("__pycache__")) == []


def test_unavailable_backend_never_gets_healthy(box):
    svc = box.host.service
    edit = EnvFileEdit(box.transport, svc.env_file, {"SGLANG_SM120_FLASHMLA_BACKEND"})
    edit.apply({"SGLANG_SM120_FLASHMLA_BACKEND": "flashinfer"})
    try:
        box.transport.run(svc.restart)
        deadline = time.monotonic() + svc.timeout
        status = None
        while time.monotonic() < deadline:
            try:
                status = httpx.get(url(box, "/health"), timeout=5)
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            if "flashinfer" in status.text:
                break
            time.sleep(0.1)
        assert status is not None and status.status_code == 503
        assert "SGLANG_SM120_FLASHMLA_BACKEND=flashinfer" in status.text
    finally:
        edit.restore()
        assert service.restart(box.transport, svc, interval=INTERVAL).healthy


def test_a_request_longer_than_the_context_is_400(box):
    resp = httpx.post(
        url(box, "/v1/completions"),
        json={"prompt": "a b c", "max_tokens": 8190},  # 3 + 8190 > 8192, the default context
    )
    assert resp.status_code == 400 and "context length of 8192" in resp.json()["message"]


def _running(box) -> int:
    info = httpx.get(url(box, "/get_server_info")).json()["kerneldev"]
    return info["running_requests"] + info["waiting_requests"]


def _wait_for_load(box, want_busy: bool) -> int:
    deadline = time.monotonic() + 60
    while (_running(box) > 0) != want_busy and time.monotonic() < deadline:
        time.sleep(0.1)
    return _running(box)


def test_a_client_that_hangs_up_is_aborted(box):
    # Long enough that it cannot end by itself within the test (a CPU step is ~0.1-0.5 s).
    body = {"text": "x", "sampling_params": {"max_new_tokens": 5000}}
    # Streaming: read the first event, then close the connection.
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", url(box, "/generate"), json={**body, "stream": True}) as resp:
            assert resp.status_code == 200
            next(resp.iter_lines())  # the first token arrived: it is decoding
    assert _wait_for_load(box, want_busy=False) == 0  # dropped, not decoded to its end
    # Not streaming: no answer comes before the end, so hang up a raw connection meanwhile.
    parsed = httpx.URL(url(box, "/generate"))
    payload = json.dumps(body).encode()
    with socket.create_connection((parsed.host, parsed.port), timeout=10) as sock:
        head = (
            f"POST /generate HTTP/1.1\r\nHost: {parsed.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        sock.sendall(head.encode() + payload)
        assert _wait_for_load(box, want_busy=True) == 1
    assert _wait_for_load(box, want_busy=False) == 0


# --- CUDA graphs and scripted streams, without a server --------------------------------------


def test_graph_batch_sizes_are_sglangs_and_a_batch_pads_to_the_next():
    from kerneldev.sandbox.service.engine import decode_graph_batch_sizes, padded_batch

    sizes = decode_graph_batch_sizes(128)
    assert sizes[:7] == [1, 2, 4, 8, 12, 16, 24] and sizes[-1] == 128 and len(sizes) == 20
    assert decode_graph_batch_sizes(100)[-2:] == [96, 100]  # the cap is added when missing
    big = decode_graph_batch_sizes(600)
    assert big[big.index(256) + 1] == 272 and big[-1] == 600 and 576 in big
    assert [padded_batch(b, sizes) for b in (1, 3, 5, 13, 127, 128)] == [1, 4, 8, 16, 128, 128]
    assert padded_batch(129, sizes) is None  # above the largest: eager


def test_scripted_stream_spec_parses_and_refuses_typos():
    from kerneldev.sandbox.service.scripted import StreamScript

    s = StreamScript.parse("chunk_tokens=4, gap_ms=50,error_request=0")
    assert (s.chunk_tokens, s.gap_ms, s.error_request) == (4, 50.0, 0)
    assert s.chunks(10) == [4, 8, 10]
    with pytest.raises(ValueError, match="chunk_token=3"):
        StreamScript.parse("chunk_token=3")
    with pytest.raises(ValueError, match="must be a number"):
        StreamScript.parse("gap_ms=fast")


@pytest.mark.gpu
def test_a_replayed_graph_decodes_the_same_tokens_as_eager(tmp_path):
    """On a GPU: the captured step gives the eager step's tokens, padded batches included."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kerneldev.sandbox.host import kernel_source
    from kerneldev.sandbox.service import engine

    kernel = tmp_path / engine.KERNEL_RELPATH
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(kernel_source(engine.KERNEL_RELPATH))
    sizes = engine.EngineSizes(2, 64, 128, 256, 512, 64, max_batch=16)
    eager = engine.DecodeEngine(str(tmp_path), sizes, disable_cuda_graph=True)
    graphs = engine.DecodeEngine(str(tmp_path), sizes)
    assert graphs.graph_sizes == [1, 2, 4, 8, 12, 16] and graphs.capture_graphs() > 0
    for batch in (1, 3, 16, 5):
        assert graphs.step(batch) == eager.step(batch) and graphs.last_step_graph
    assert not eager.last_step_graph and graphs.info()["cuda_graph"]["enabled"]


def test_starts_that_cannot_share_the_launchers_imports_are_fresh_execs(monkeypatch):
    """CUDA (no fork after it) and scripted streams (no torch to share) skip the launcher; an
    environment is one launcher whatever the SSH connection's own variables are."""
    from kerneldev.sandbox.service import launcher

    monkeypatch.delenv(SPEC_ENV, raising=False)
    assert not launcher._not_for_a_launcher(["--root", "r", "--port", "1"])
    assert launcher._not_for_a_launcher(["--root", "r", "--device", "cuda"])
    assert launcher._not_for_a_launcher(["--root", "r", "--device=cuda"])
    assert launcher._not_for_a_launcher(["--root", "r", "--scripted-stream", "gap_ms=1"])
    monkeypatch.setenv(SPEC_ENV, "gap_ms=1")
    assert launcher._not_for_a_launcher(["--root", "r"])

    env = {"PATH": "/bin", "SSH_CLIENT": "127.0.0.1 5000 22"}
    same = {**env, "SSH_CLIENT": "127.0.0.1 6000 22", "SSH_CONNECTION": "x"}
    assert launcher.env_key(env) == launcher.env_key(same)
    assert launcher.env_key(env) != launcher.env_key({**env, "SGLANG_SM120_MMA_FLASHMLA": "1"})
