"""Load generator for `kerneldev bench --service` and `kerneldev profile`; standard library only.

kerneldev uploads this file (and `trace_summary.py` beside it) to a temporary folder on the
host and runs it there with the host's python against the service URL as seen from the host,
so SSH latency is never part of a measurement. It writes one JSON object (`--out`).

    python3 service_load.py bench --url URL --concurrency 1,16 --requests 8 --input-len 32 \
        --max-new-tokens 16 --out result.json
    python3 service_load.py profile --url URL --concurrency 8 --max-new-tokens 32 \
        --output-dir DIR --top 15 --out result.json

Requests are SGLang's native streaming `POST /generate` (`sampling_params.max_new_tokens`,
`ignore_eos`), as SGLang's `bench_serving --backend sglang` sends them. Per request it records,
as bench_serving does: `ttft` (seconds from sending to the first chunk carrying text), `itl`
(seconds between successive chunks carrying text), `e2e` (sending to the end of the stream)
and `output_tokens` (the last chunk's `meta_info.completion_tokens`). `concurrency` workers
each keep one request in flight until `requests` are done.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

SCHEMA = "kerneldev.service-load/1"
WORDS = ("the", "kernel", "decode", "cache", "token", "page", "sparse", "attention")


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


def prompt(input_len: int, seed: int) -> str:
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(input_len))


def one_request(url: str, text: str, max_new_tokens: int, timeout: float) -> dict:
    """One streaming /generate request; the timings bench_serving takes."""
    out = {"ok": False, "ttft": None, "itl": [], "e2e": None, "output_tokens": 0, "error": None}
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    start = time.perf_counter()
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
            out["error"] = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace')}"
            return out
        last = None
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            data = json.loads(payload)
            if not data.get("text"):
                continue
            now = time.perf_counter()
            if last is None:
                out["ttft"] = now - start
            else:
                out["itl"].append(now - last)
            last = now
            meta = data.get("meta_info") or {}
            out["output_tokens"] = int(meta.get("completion_tokens") or len(out["itl"]) + 1)
        out["e2e"] = time.perf_counter() - start
        out["ok"] = done and out["ttft"] is not None
        if not out["ok"] and out["error"] is None:
            out["error"] = "the stream ended without data: [DONE]" if not done else "no text"
    except (OSError, http.client.HTTPException, ValueError) as err:
        out["error"] = f"{type(err).__name__}: {err}"
    finally:
        conn.close()
    return out


def run_level(
    url: str, concurrency: int, requests: int, input_len: int, max_new: int, timeout: float
) -> dict:
    """`requests` requests, `concurrency` in flight at a time."""
    results: list[dict | None] = [None] * requests
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= requests:
                return
            r = one_request(url, prompt(input_len, i), max_new, timeout)
            r["prompt_tokens"] = input_len
            results[i] = r

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


def cmd_bench(args) -> dict:
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.warmup:
        run_level(
            args.url, 1, args.warmup, args.input_len, min(4, args.max_new_tokens), args.timeout
        )
    out = []
    for c in levels:
        sys.stderr.write(f"  concurrency {c}: {args.requests} requests\n")
        sys.stderr.flush()
        out.append(
            run_level(args.url, c, args.requests, args.input_len, args.max_new_tokens, args.timeout)
        )
    return {"schema": SCHEMA, "url": args.url, "levels": out}


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
    run_level(args.url, 1, 1, args.input_len, 2, args.timeout)
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
    b.add_argument("--warmup", type=int, default=2)
    pr = sub.choices["profile"]
    pr.add_argument("--concurrency", type=int, default=8)
    pr.add_argument("--output-dir", required=True)
    pr.add_argument("--top", type=int, default=15)
    pr.add_argument("--trace-wait", type=float, default=120.0)
    args = p.parse_args(argv)
    try:
        result = cmd_bench(args) if args.cmd == "bench" else cmd_profile(args)
    except (RuntimeError, OSError, http.client.HTTPException) as err:
        sys.stderr.write(f"service_load.py: error: {err}\n")
        return 1
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
