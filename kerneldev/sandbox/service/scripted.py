"""Scripted-stream mode of the sandbox service: `/generate` streams on a fixed timetable.

For checking what a benchmark client *computes* rather than how fast anything is: no engine
runs, and every streaming `/generate` answers on a schedule fixed by the spec, so two clients
run against it must agree on every count and (to timer precision) every latency.

    --scripted-stream "chunk_tokens=3,gap_ms=60,first_ms=60,error_request=2,error_after=1"
    (or the same text in $KERNELDEV_SANDBOX_SCRIPTED_STREAM)

- `first_ms`: the first chunk comes this long after the request arrives;
- `chunk_tokens`: each chunk brings this many new tokens (the last one the rest), as SGLang
  streams under speculative decoding or `--stream-interval` > 1: `text` is the text so far,
  `meta_info.completion_tokens` the tokens so far;
- `gap_ms`: the time between chunks;
- `error_request`: the n-th `/generate` after the last `/flush_cache` (counting from 1; 0: none)
  fails inside its 200 stream after `error_after` chunks, as SGLang's HTTP server reports an
  error raised after the stream began: `data: {"error": {"message", "type", "code",
  "retryable"}}`, then `data: [DONE]`. Counting from the flush makes it the same request for
  any client that flushes after its warm-up (SGLang's `--flush-cache`, kerneldev always).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, fields

SPEC_ENV = "KERNELDEV_SANDBOX_SCRIPTED_STREAM"
ERROR_MESSAGE = "scripted failure: the sandbox fails this request inside its stream"


@dataclass(frozen=True)
class StreamScript:
    chunk_tokens: int = 3
    gap_ms: float = 60.0
    first_ms: float = 60.0
    error_request: int = 2
    error_after: int = 1

    @classmethod
    def parse(cls, text: str) -> StreamScript:
        """`key=value,...` with the field names above; unknown keys or bad values: ValueError."""
        known = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise ValueError(
                    f"--scripted-stream: {part!r} is not one of "
                    + ", ".join(f"{k}=N" for k in known)
                )
            try:
                value = float(raw) if known[key] == "float" else int(raw)
            except ValueError:
                raise ValueError(
                    f"--scripted-stream: {key} must be a number, got {raw!r}"
                ) from None
            if value < 0 or (key == "chunk_tokens" and value < 1):
                raise ValueError(f"--scripted-stream: {key} out of range: {raw}")
            values[key] = value
        return cls(**values)

    def chunks(self, max_new_tokens: int) -> list[int]:
        """The cumulative token count after each chunk."""
        counts, n = [], 0
        while n < max_new_tokens:
            n = min(max_new_tokens, n + self.chunk_tokens)
            counts.append(n)
        return counts


class ScriptedStreams:
    """Counts requests since the last flush and plays each one's timetable."""

    def __init__(self, script: StreamScript) -> None:
        self.script = script
        self.since_flush = 0

    def flush(self) -> None:
        self.since_flush = 0

    def admit(self) -> bool:
        """Count one /generate; True when it is the one that fails."""
        self.since_flush += 1
        return self.script.error_request > 0 and self.since_flush == self.script.error_request

    async def events(self, prompt_tokens: int, max_new_tokens: int, token_text, fails: bool):
        """The stream's payloads (dicts), each at its time; the last is the error (if any)."""
        rid = uuid.uuid4().hex
        start = time.perf_counter()
        s = self.script
        text, prev = "", 0
        for i, count in enumerate(s.chunks(max_new_tokens)):
            if fails and i == s.error_after:
                yield {
                    "error": {
                        "message": ERROR_MESSAGE,
                        "type": "invalid_request_error",
                        "code": 400,
                        "retryable": False,
                    }
                }
                return
            due = start + (s.first_ms + i * s.gap_ms) / 1000.0
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            text += "".join(token_text(t) for t in range(prev, count))
            prev = count
            done = count >= max_new_tokens
            yield {
                "text": text,
                "output_ids": list(range(count)),
                "meta_info": {
                    "id": rid,
                    "finish_reason": {"type": "length", "length": count} if done else None,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": count,
                    "cached_tokens": 0,
                    "e2e_latency": time.perf_counter() - start,
                },
                "index": 0,
            }
        if fails:  # error_after >= the number of chunks: fail at the end
            yield {"error": {"message": ERROR_MESSAGE, "type": "invalid_request_error",
                             "code": 400, "retryable": False}}  # fmt: skip
