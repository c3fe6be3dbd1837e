"""`kerneldev bench --service` against SGLang's own client, on the sandbox's scripted streams.

The sandbox serves `/generate` on a fixed timetable (the first chunk after 480 ms, then 3 tokens
a chunk, 150 ms between chunks, the second request after each `/flush_cache` failing inside its
stream), so what the two clients report can only differ by definition, not by speed. SGLang
0.5.23's client (`sglang.benchmark.serving`, from the release `scripts/sglang_releases.py` lays
out) runs with its default start-up: it finds the model on `/v1/models` and its tokenizer through
`/model_info`'s `tokenizer_path` (a word-level tokenizer built here, offline).

Both must agree exactly on the requests that completed and failed and on every token count,
and on ITL, TPOT and TTFT within 10%. One documented difference: SGLang's client counts the request
whose stream carried `{"error": ...}` as *successful* (with the 3 tokens it had), where kerneldev
counts it failed with the server's message; the test checks that difference exactly too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kerneldev.config import load_config
from kerneldev.hosts.transport import open_transport
from kerneldev.sandbox.host import create_sandbox, decode_service_available
from kerneldev.sandbox.service.scripted import ERROR_MESSAGE, SPEC_ENV
from tests import sglang_client
from tests.clirun import run_kerneldev
from tests.service_start import restart_until_healthy

# Each client measures its own run, so a late wake-up of the server or of one client (a loaded
# 2-core machine) moves its numbers by ms that are not in the definitions; the timetable is long
# enough that they stay well inside the 10% the check keeps. first_ms: TTFT is one value per
# request, its median carries each client's start-up jitter: at 60 ms it moved by 10 ms (76 vs
# 67, past 10%), at 240 ms under load ~19 by 12 ms (253 vs 265: 4.6%). gap_ms: TPOT is a
# request's first-to-last-chunk span (2 gaps) over 7 tokens, and a late first chunk shortens it:
# at 60 ms the medians were 17.2 vs 15.9 (8.7%) under that load. 480 and 150 halve those shares.
SPEC = "chunk_tokens=3,gap_ms=150,first_ms=480,error_request=2,error_after=1"
REQUESTS, CONCURRENCY, INPUT_LEN, OUTPUT_LEN = 8, 2, 6, 8
FIRST_CHUNK = 3  # tokens the failing request had before its error


def _client_ready() -> str | None:
    """Why SGLang's client cannot run here, or None."""
    if not decode_service_available():
        return "needs fastapi, uvicorn, torch and triton"
    try:
        sglang_client.client_paths()
    except sglang_client.ClientUnavailable as err:
        return str(err)
    return None


WHY_NOT = _client_ready()
# CI fetches the release (scripts/bootstrap test): there a missing piece fails, never skips,
# unless the fetch was turned off (KERNELDEV_SGLANG=skip).
if WHY_NOT and os.environ.get("CI") and os.environ.get("KERNELDEV_SGLANG") != "skip":
    raise RuntimeError(f"the SGLang client agreement test cannot run in CI: {WHY_NOT}")
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


@pytest.fixture(scope="module")
def scripted_box(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scripted")
    tokenizer = sglang_client.write_word_tokenizer(folder / "tokenizer", vocab_size=1000)
    sandbox = create_sandbox(folder / "box", use_ssh=False, decode_service=True)
    env_file = sandbox.service_dir / "service.env"
    with env_file.open("a") as f:
        f.write(f"{SPEC_ENV}='{SPEC}'\nKERNELDEV_SANDBOX_TOKENIZER={tokenizer}\n")
    host = load_config(sandbox.config_path).host(sandbox.host_name)
    with open_transport(host) as transport:
        healthy, _ = restart_until_healthy(transport, host, 0.1)
    assert healthy, "the scripted sandbox never got healthy"
    sandbox.host = host
    try:
        yield sandbox
    finally:
        sandbox.close()


def _sglang_client(box, out: Path) -> dict:
    port = box.host.service.url.rsplit(":", 1)[1]
    args = [
        "--backend", "sglang", "--host", "127.0.0.1", "--port", port,
        "--dataset-name", "random-ids", "--tokenize-prompt",
        "--num-prompts", str(REQUESTS), "--random-input-len", str(INPUT_LEN),
        "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "1",
        "--max-concurrency", str(CONCURRENCY), "--flush-cache",
        "--output-file", str(out), "--output-details", "--disable-tqdm",
    ]  # fmt: skip
    # A hang guard, not a speed check: the client imports torch and transformers, which took
    # over 300 s once at load ~20 (parallel workers and other jobs on 2 cores).
    done = sglang_client.run_client(args, timeout=900, cwd=out.parent)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "Serving Benchmark Result" in done.stdout, done.stdout[-2000:]
    return json.loads(out.read_text().splitlines()[-1])


def _kerneldev(box) -> dict:
    done = run_kerneldev(
        "--config", str(box.config_path), "bench", "--service", "--variants", "simt",
        "--concurrency", str(CONCURRENCY), "--requests", str(REQUESTS),
        "--input-len", str(INPUT_LEN), "--max-new-tokens", str(OUTPUT_LEN),
        "--rounds", "1", "--warmup", "1", "--json",
        env={"KERNELDEV_SSH_CONFIG": "none"}, timeout=900,  # a hang guard, as above
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]  # one request failed: exit 1
    return json.loads(done.stdout)["result"]


def test_sglang_client_and_bench_service_agree_on_scripted_streams(scripted_box, tmp_path):
    sgl = _sglang_client(scripted_box, tmp_path / "sglang.jsonl")
    kd = _kerneldev(scripted_box)
    m = kd["results"][0]["metrics"]

    # The failing request: kerneldev says failed, with the server's message.
    assert (m["completed"], m["failed"]) == (REQUESTS - 1, 1)
    assert len(m["errors"]) == 1 and ERROR_MESSAGE in m["errors"][0]["message"]
    assert m["errors"][0]["requests"] == 1
    # SGLang's client counts it a success with the tokens it had (its definition; documented).
    assert sgl["completed"] == REQUESTS and sgl["errors"] == [""] * REQUESTS
    assert sorted(sgl["output_lens"]) == [FIRST_CHUNK] + [OUTPUT_LEN] * (REQUESTS - 1)
    full = [i for i, n in enumerate(sgl["output_lens"]) if n == OUTPUT_LEN]

    # Exactly the same requests complete, with the same token counts.
    assert m["completed"] == len(full)
    assert m["total_output"] == sum(sgl["output_lens"][i] for i in full)
    assert m["total_output"] == sgl["total_output_tokens"] - FIRST_CHUNK
    assert m["total_input"] == sum(sgl["input_lens"][i] for i in full) == len(full) * INPUT_LEN
    runs = kd["runs"]
    assert runs[0]["flush_cache"]["flushed"] is True

    # ITL per token: the same number of values (the failing request has none in either).
    sgl_itls = [x for i in full for x in sgl["itls"][i]]
    assert sum(len(sgl["itls"][i]) for i in range(REQUESTS)) == len(sgl_itls)
    assert len(sgl_itls) == m["completed"] * (OUTPUT_LEN - FIRST_CHUNK)
    # Medians and means (a tail percentile is one late chunk on a loaded machine).
    for key in ("median_itl_ms", "mean_itl_ms", "median_tpot_ms", "median_ttft_ms"):
        assert m[key] == pytest.approx(sgl[key], rel=0.10), (key, m[key], sgl[key])
    # The fixed gaps: 150 ms over 3 tokens (50 ms a token), then 150 ms over the last 2 (75 ms):
    # per chunk (kerneldev's old definition) the median would be 150 ms.
    assert m["median_itl_ms"] == pytest.approx(50.0, rel=0.10)

    # Both saw the same server settings; kerneldev saved them with the result.
    server = kd["server"]["simt"]
    assert server["source"] == "/server_info"
    assert server["settings"]["version"] == sgl["server_info"]["version"]
    assert server["settings"]["disable_cuda_graph"] is True
    assert kd["server_differences"] == []
