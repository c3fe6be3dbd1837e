"""Load generator for `kerneldev bench --service` and `kerneldev profile`; standard library only.

kerneldev uploads this file (and `trace_summary.py` beside it) to a temporary folder on the
host and runs it there with the host's python against the service URL as seen from the host,
so SSH latency is never part of a measurement. It writes one JSON object (`--out`).

    python3 service_load.py bench --url URL --concurrency 1,16 --requests 8 --input-len 32 \
        --max-new-tokens 16 --out result.json
    python3 service_load.py profile --url URL --concurrency 8 --max-new-tokens 32 \
        --output-dir DIR --top 15 --out result.json

Requests are SGLang's native streaming `POST /generate` (`sampling_params.max_new_tokens`,
`ignore_eos`), as SGLang's `bench_serving --backend sglang` sends them. Per request it records
what SGLang 0.5.23's client (`sglang.benchmark.serving`) records:

- `ttft`: seconds from sending to the first chunk carrying text;
- `itl`: per *token*, not per chunk: a later chunk that brings n new tokens (by
  `meta_info.completion_tokens`) after a gap g adds n values g/n; a chunk that brings no new
  token is skipped (speculative decoding and `--stream-interval` > 1 send several per chunk);
- `e2e`: sending to the last chunk of the stream;
- `output_tokens` and `prompt_tokens`: the server's `meta_info.completion_tokens` and
  `meta_info.prompt_tokens`, not counted here.

One deliberate difference: an error the server reports inside a 200 stream
(`data: {"error": {"message": ...}}`, or a `meta_info.finish_reason` of type `abort`) makes the
request *failed* with the server's message. SGLang's client counts such a request as
successful (with the tokens it had before the error), which hides the failure.

Prompts are token ids (`input_ids`), `--input-len` of them, drawn from ids 1000-29999 (inside
every current model's vocabulary, clear of the special tokens at the start), seeded by
`--seed`: every request of a level gets its own first token, so no two share a prefix and
SGLang's radix cache cannot serve part of a prompt. Each level starts with `/flush_cache` (where
the server has it: the answer is recorded), after its warm-up, as SGLang's client does with
`--flush-cache`. The same seed gives every variant the same prompts.

Before the levels it records the server's settings (`GET /server_info`, else
`/get_server_info`) and `GET /model_info`, so a result says what served it.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import random
import sys
import threading
import time
import urllib.parse

SCHEMA = "kerneldev.service-load/1"
# Prompt token ids: inside every current model's vocabulary, above the special tokens.
PROMPT_ID_LOW, PROMPT_ID_HIGH = 1000, 30000
WARMUP_MAX_TOKENS = 32  # SGLang's client caps its warm-up request's output at 32 tokens
SETTLE_S = 1.0  # SGLang's client sleeps 1 s between warm-up (and flush) and the timed run
# The server settings that change what a decode timing means; saved with every result.
SERVER_SETTINGS = (
    "version",
    "model_path",
    "tp_size",
    "dp_size",
    "attention_backend",
    "decode_attention_backend",
    "kv_cache_dtype",
    "page_size",
    "disable_cuda_graph",
    "cuda_graph_max_bs",
    "cuda_graph_bs",
    "cuda_graph_max_bs_decode",
    "cuda_graph_bs_decode",
    "disable_cuda_graph_padding",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "stream_interval",
    "max_running_requests",
    "chunked_prefill_size",
    "enable_dp_attention",
)


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=timeout), parts.path.rstrip("/")


def post(url: str, path: str, body: dict | None, timeout: float = 600.0) -> tuple[int, str]:
    conn, base = _connection(url, timeout)
    try:
        data = json.dumps(body or {}).encode()
        conn.request("POST", base + path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def get(url: str, path: str, timeout: float = 30.0) -> tuple[int, str]:
    conn, base = _connection(url, timeout)
    try:
        conn.request("GET", base + path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


# --- prompts ------------------------------------------------------------------------------


def prompts(count: int, input_len: int, seed: int) -> list[list[int]]:
    """`count` prompts of `input_len` token ids, no two starting with the same id."""
    span = PROMPT_ID_HIGH - PROMPT_ID_LOW
    if count > span:
        raise ValueError(f"at most {span} requests per level (distinct first tokens)")
    rng = random.Random(seed)
    firsts = rng.sample(range(PROMPT_ID_LOW, PROMPT_ID_HIGH), count)
    return [
        [first] + [rng.randrange(PROMPT_ID_LOW, PROMPT_ID_HIGH) for _ in range(input_len - 1)]
        for first in firsts
    ]


# --- one request --------------------------------------------------------------------------


def stream_error(data: dict) -> str | None:
    """The server's error carried inside a 200 stream, or None.

    SGLang's HTTP server sends `{"error": {"message": ...}}` when the request fails after the
    stream began, and ends a request its scheduler aborted with a chunk whose
    `meta_info.finish_reason` is `{"type": "abort", "message": ...}`."""
    err = data.get("error")
    if err:
        if isinstance(err, dict):
            return str(err.get("message") or json.dumps(err))
        return str(err)
    meta = data.get("meta_info") or {}
    finish = meta.get("finish_reason") if isinstance(meta, dict) else None
    if isinstance(finish, dict) and finish.get("type") == "abort":
        return "aborted by the server: " + str(finish.get("message") or "no message")
    return None


class StreamTimer:
    """Turns the chunks of one stream into SGLang's client's timings (see the module doc)."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.ttft: float | None = None
        self.itl: list[float] = []
        self.last_chunk: float | None = None
        self.last_tokens = 0
        self.output_tokens = 0
        self.prompt_tokens: int | None = None

    def chunk(self, data: dict, now: float) -> None:
        meta = data.get("meta_info") or {}
        if meta.get("prompt_tokens"):
            self.prompt_tokens = int(meta["prompt_tokens"])
        if not data.get("text"):
            return  # SGLang's client skips chunks without text
        tokens = int(meta.get("completion_tokens") or self.last_tokens + 1)
        if self.ttft is None:
            self.ttft = now - self.start
        else:
            new = tokens - self.last_tokens
            if new <= 0:
                return  # no new token: not a decode step, no ITL (as SGLang's client)
            self.itl.extend([(now - self.last_chunk) / new] * new)
        self.last_chunk = now
        self.last_tokens = tokens
        self.output_tokens = tokens


def one_request(url: str, ids: list[int], max_new_tokens: int, timeout: float) -> dict:
    """One streaming /generate request; the timings SGLang's client takes."""
    out = {"ok": False, "ttft": None, "itl": [], "e2e": None, "output_tokens": 0, "error": None}
    out["prompt_tokens"] = len(ids)
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    start = time.perf_counter()
    timer = StreamTimer(start)
    conn, base = _connection(url, timeout)
    try:
        conn.request(
            "POST",
            base + "/generate",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read(2000).decode("utf-8", "replace").strip()
            out["error"] = f"HTTP {resp.status}: {_server_message(text)}"
            return out
        done = False
        last = start
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            last = time.perf_counter()
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            data = json.loads(payload)
            if not isinstance(data, dict):
                continue
            err = stream_error(data)
            if err is not None and out["error"] is None:
                out["error"] = f"the server reported: {err}"
            timer.chunk(data, last)
        out["e2e"] = last - start
        out["ttft"], out["itl"] = timer.ttft, timer.itl
        out["output_tokens"] = timer.output_tokens
        if timer.prompt_tokens is not None:
            out["prompt_tokens"] = timer.prompt_tokens
        if out["error"] is None:
            if not done:
                out["error"] = "the stream ended without data: [DONE]"
            elif timer.ttft is None:
                out["error"] = "the stream carried no text"
        out["ok"] = out["error"] is None
    except (OSError, http.client.HTTPException, ValueError) as err:
        out["error"] = f"{type(err).__name__}: {err}"
    finally:
        conn.close()
    return out


def _server_message(text: str) -> str:
    """SGLang's error bodies: {"error": {"message"}} or {"message"}; else the text."""
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if data.get("message"):
            return str(data["message"])
        if isinstance(err, str):
            return err
    return text[:300]


# --- levels -------------------------------------------------------------------------------


def run_level(
    url: str,
    concurrency: int,
    requests: int,
    input_len: int,
    max_new: int,
    timeout: float,
    seed: int = 0,
) -> dict:
    """`requests` requests, `concurrency` in flight at a time."""
    results: list[dict | None] = [None] * requests
    batch = prompts(requests, input_len, seed)
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= requests:
                return
            results[i] = one_request(url, batch[i], max_new, timeout)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(max(1, concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "concurrency": concurrency,
        "duration": time.perf_counter() - start,
        "requests": results,
    }


def flush_cache(url: str) -> dict:
    """POST /flush_cache; what the server answered (404: it has none)."""
    try:
        status, text = post(url, "/flush_cache", None, timeout=60.0)
    except (OSError, http.client.HTTPException) as err:
        return {"flushed": False, "status": None, "message": f"{type(err).__name__}: {err}"}
    return {"flushed": status == 200, "status": status, "message": text.strip()[:300]}


def server_info(url: str) -> dict:
    """The server's settings (SERVER_SETTINGS) from /server_info (or /get_server_info) and
    /model_info; `source` names the endpoint, `error` says why none answered."""
    out: dict = {"source": None, "settings": {}, "model_info": None, "kerneldev": None}
    for path in ("/server_info", "/get_server_info"):
        try:
            status, text = get(url, path)
        except (OSError, http.client.HTTPException) as err:
            out["error"] = f"{path}: {type(err).__name__}: {err}"
            continue
        if status != 200:
            out["error"] = f"{path}: HTTP {status}"
            continue
        try:
            info = json.loads(text)
        except ValueError:
            out["error"] = f"{path}: not JSON"
            continue
        if isinstance(info, dict) and isinstance(info.get("decode"), list) and info["decode"]:
            info = info["decode"][0]  # a PD router: the decode server's answer
        if not isinstance(info, dict):
            continue
        out["source"] = path
        out.pop("error", None)
        out["settings"] = {k: info[k] for k in SERVER_SETTINGS if k in info}
        states = info.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], dict):
            accept = states[0].get("avg_spec_accept_length")
            if accept is not None:
                out["settings"]["avg_spec_accept_length"] = accept
        if isinstance(info.get("kerneldev"), dict):
            out["kerneldev"] = info["kerneldev"]
        break
    try:
        status, text = get(url, "/model_info")
        if status == 200:
            info = json.loads(text)
            if isinstance(info, dict):
                keep = ("model_path", "served_model_name", "tokenizer_path", "model_type")
                out["model_info"] = {k: info.get(k) for k in keep if k in info}
    except (OSError, http.client.HTTPException, ValueError):
        pass
    return out


def cmd_bench(args) -> dict:
    levels = [int(c) for c in args.concurrency.split(",")]
    info = server_info(args.url)
    out = []
    for c in levels:
        warm = max(args.warmup, c) if args.warmup else 0
        level_seed = args.seed * 1000003 + c
        if warm:
            sys.stderr.write(f"  concurrency {c}: {warm} warm-up requests\n")
            warm_max = min(WARMUP_MAX_TOKENS, args.max_new_tokens)
            run_level(args.url, c, warm, args.input_len, warm_max, args.timeout, level_seed + 1)
        flushed = flush_cache(args.url)
        time.sleep(args.settle)
        sys.stderr.write(f"  concurrency {c}: {args.requests} requests\n")
        sys.stderr.flush()
        level = run_level(
            args.url, c, args.requests, args.input_len, args.max_new_tokens, args.timeout,
            level_seed,
        )  # fmt: skip
        level["warmup"] = warm
        level["flush_cache"] = flushed
        out.append(level)
    return {"schema": SCHEMA, "url": args.url, "server": info, "levels": out}


def newest_trace(folder: str, since: float = 0.0) -> str | None:
    """The newest trace under `folder` written at `since` or later; a decode-stage trace
    (SGLang's profile_by_stage writes `...-DECODE.trace.json.gz`) before any other."""
    found = [
        p
        for pattern in ("*.trace.json.gz", "*.trace.json", "*.pt.trace.json*")
        for p in glob.glob(os.path.join(folder, "**", pattern), recursive=True)
        if os.path.getmtime(p) >= since
    ]
    decode = [p for p in found if "DECODE" in os.path.basename(p)]
    return max(decode or found, key=os.path.getmtime) if found else None


def start_decode_profile(args) -> bool:
    """POST /start_profile for decode steps only where the server supports it (SGLang's
    profile_by_stage with num_steps: the prefill is traced apart and the decode trace, GPU
    activities only, is written by itself after num_steps decode steps); else the plain
    request (the window then holds the prefill too). True when the staged request was taken."""
    staged = {
        "output_dir": args.output_dir,
        "profile_by_stage": True,
        "num_steps": max(1, args.max_new_tokens - 2),  # ends before the requests do
        "activities": ["GPU"],
    }
    status, _ = post(args.url, "/start_profile", staged)
    if status == 200:
        return True
    status, text = post(args.url, "/start_profile", {"output_dir": args.output_dir})
    if status != 200:
        raise RuntimeError(f"/start_profile answered HTTP {status}: {text.strip()}")
    return False


def cmd_profile(args) -> dict:
    os.makedirs(args.output_dir, exist_ok=True)
    # Warm up first so the trace holds decode steps, not the first call's compilation.
    run_level(args.url, 1, 1, args.input_len, 2, args.timeout, seed=1)
    started = time.time() - 1.0  # traces older than this are an earlier run's
    staged = start_decode_profile(args)
    level = run_level(
        args.url,
        args.concurrency,
        args.concurrency,
        args.input_len,
        args.max_new_tokens,
        args.timeout,
    )
    status, text = post(args.url, "/stop_profile", {})
    if status != 200 and not staged:  # a staged profile may have stopped by itself
        raise RuntimeError(f"/stop_profile answered HTTP {status}: {text.strip()}")
    # The trace is written after the answer on some servers: wait for it to appear.
    trace = None
    deadline = time.monotonic() + args.trace_wait
    while time.monotonic() < deadline:
        trace = newest_trace(args.output_dir, started)
        if trace and time.time() - os.path.getmtime(trace) > 0.5:  # finished writing
            break
        time.sleep(0.2)
    if trace is None:
        failed = [r for r in level["requests"] if not (r and r["ok"])]
        if failed and len(failed) == len(level["requests"]):
            # Nothing was decoded: that, not the folder, is why there is nothing to trace.
            why = (failed[0] or {}).get("error") or "no answer"
            raise RuntimeError(
                f"every profiled request failed ({len(failed)} of {len(failed)}; the first: "
                f"{why}), and no trace appeared in {args.output_dir} after /stop_profile"
            )
        raise RuntimeError(f"no trace appeared in {args.output_dir} after /stop_profile")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import trace_summary

    return {
        "schema": SCHEMA,
        "url": args.url,
        "levels": [level],
        "decode_only": staged,
        "trace": trace,
        "trace_bytes": os.path.getsize(trace),
        "summary": trace_summary.summarise(trace, args.top),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="kerneldev's load generator (runs on the host)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("bench", "profile"):
        s = sub.add_parser(name)
        s.add_argument("--url", required=True)
        s.add_argument("--input-len", type=int, default=32)
        s.add_argument("--max-new-tokens", type=int, default=16)
        s.add_argument("--timeout", type=float, default=600.0)
        s.add_argument("--out", required=True)
    b = sub.choices["bench"]
    b.add_argument("--concurrency", default="1")
    b.add_argument("--requests", type=int, default=8)
    b.add_argument(
        "--warmup", type=int, default=2, help="warm-up requests per level (at least c of them)"
    )
    b.add_argument("--seed", type=int, default=0, help="seeds the prompts (same for every variant)")
    b.add_argument("--settle", type=float, default=SETTLE_S, help="seconds after warm-up")
    pr = sub.choices["profile"]
    pr.add_argument("--concurrency", type=int, default=8)
    pr.add_argument("--output-dir", required=True)
    pr.add_argument("--top", type=int, default=15)
    pr.add_argument("--trace-wait", type=float, default=120.0)
    args = p.parse_args(argv)
    try:
        result = cmd_bench(args) if args.cmd == "bench" else cmd_profile(args)
    except (RuntimeError, ValueError, OSError, http.client.HTTPException) as err:
        sys.stderr.write(f"service_load.py: error: {err}\n")
        return 1
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
