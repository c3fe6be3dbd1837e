"""The HTTP side of the sandbox service: SGLang's API subset over a continuous-batching loop.

Endpoints (request and response shapes as SGLang's):

    GET  /health, /health_generate, /ready, /v1/models, /model_info (/get_model_info),
         /server_info (/get_server_info), GET/POST /flush_cache: sglang_api.py (SGLang's
                            field names; `kerneldev` in the server info: variant, device, env)
    POST /generate          {"text" | "input_ids", "sampling_params": {"max_new_tokens"},
                            "stream"}; streaming: `data: {text, output_ids, meta_info}` events
                            with the text so far, then `data: [DONE]`
    POST /v1/completions    OpenAI completions; `stream` chunks carry the new text, then
                            `data: [DONE]`; `usage` when not streaming (or include_usage)
    POST /start_profile     torch.profiler on; optional {"output_dir", "num_steps",
                            "start_step", "activities"} as SGLang's: start_step = the decode
                            step at which tracing starts (at least the next one), num_steps =
                            steps traced before it stops by itself, activities ["GPU"] = GPU
                            kernels only (here CPU ranges too when there is no GPU),
                            profile_by_stage: the trace is the decode stage's (`-DECODE`)
    POST /stop_profile      writes `<output_dir>/<time>-TP-0.trace.json.gz` (Chrome trace);
                            output_dir defaults to $SGLANG_TORCH_PROFILER_DIR, else /tmp

A request whose prompt plus new tokens exceed `--context-length` is a 400, as SGLang refuses it.
A request whose client hangs up (streaming or not) is aborted: it leaves the batch at the next
step instead of decoding to its end for nobody.

One scheduler thread owns the engine: every step it admits waiting requests (up to the
engine's max batch), runs one decode step for all running requests together, hands each its
token, and retires finished ones. Every `decode_log_interval` steps it logs SGLang's line
`Decode batch. #running-req: N, #token: T, token usage: U, cuda graph: B, gen throughput
(token/s): X, #queue-req: Q` (B: whether the step replayed a CUDA graph, engine.py). Tokens
are words of a synthetic vocabulary (" t123"); a prompt's token count is its number of
whitespace-separated words (or len(input_ids)).

`main` runs in a fresh `python -m kerneldev.sandbox.service` or, on the sandbox's CPU-only
restarts, in a worker forked by the resident launcher (launcher.py) with the restart's
environment: either way it reads its arguments, the env file's switches and the kernel file
at this start.

`--scripted-stream SPEC` serves `/generate` on a fixed timetable instead, with no engine
(scripted.py): for checking what benchmark clients compute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from kerneldev.sandbox.service import engine as engine_mod
from kerneldev.sandbox.service import sglang_api
from kerneldev.sandbox.service.scripted import SPEC_ENV, ScriptedStreams, StreamScript

log = logging.getLogger("sandbox_service")
MODEL_NAME = "kerneldev-sandbox-dsv4"
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CONTEXT_LENGTH = 8192
TOKENIZER_ENV = "KERNELDEV_SANDBOX_TOKENIZER"
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is there


def token_text(token_id: int) -> str:
    return f" t{token_id}"


@dataclass
class GenRequest:
    rid: str
    prompt_tokens: int
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue  # receives token ids, then None when finished (or an error string)
    created: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    cancelled: bool = False  # the client went away: drop it at the next step
    ended: bool = False  # the scheduler finished it (all tokens, or a failed step)


class Scheduler:
    """Continuous batching over the engine, in one thread; also owns the profiler."""

    def __init__(self, log_interval: int) -> None:
        self.engine: engine_mod.DecodeEngine | None = None
        self.load_error: str | None = None
        self.log_interval = max(1, log_interval)
        self.waiting: deque[GenRequest] = deque()
        self.running: list[GenRequest] = []
        self.cond = threading.Condition()
        self.steps = 0
        self.profile_cmd: tuple[str, dict, threading.Event, dict] | None = None
        self.profiler = None
        self.profile_dir: str | None = None
        self.profile_steps_left: int | None = None
        self.last_gen_throughput = 0.0
        self.profile_start_at: int | None = None  # start_step: the step tracing waits for
        self.profile_pending = None  # the profiler to start at profile_start_at

    # -- called from the HTTP side -----------------------------------------------------------
    def submit(self, req: GenRequest) -> None:
        with self.cond:
            self.waiting.append(req)
            self.cond.notify()

    def cancel(self, req: GenRequest) -> None:
        """Abort a request whose client is gone (the scheduler drops it before its next step)."""
        with self.cond:
            if req.cancelled:
                return
            req.cancelled = True
            if req in self.waiting:
                self.waiting.remove(req)
        log.info("Abort request %s (client disconnected)", req.rid)

    def load_counts(self) -> dict:
        with self.cond:
            return {"running_requests": len(self.running), "waiting_requests": len(self.waiting)}

    def profile(self, action: str, body: dict, timeout: float = 600.0) -> dict:
        """Run start/stop in the scheduler thread (the profiler follows the thread that runs
        the steps) and wait for its answer."""
        done = threading.Event()
        answer: dict = {}
        with self.cond:
            self.profile_cmd = (action, body, done, answer)
            self.cond.notify()
        if not done.wait(timeout):
            return {"ok": False, "message": "the scheduler did not answer"}
        return answer

    # -- the scheduler thread ----------------------------------------------------------------
    def load(
        self, root: str, sizes: engine_mod.EngineSizes | None, graph_options: dict | None = None
    ) -> None:
        try:
            eng = engine_mod.DecodeEngine(root, sizes, **(graph_options or {}))
            eng.step(1)  # warm-up: compile (GPU) or first interpretation (CPU) before ready
            if eng.graph_sizes:
                try:
                    took = eng.capture_graphs()
                except Exception as err:  # noqa: BLE001 - serve eager, say why everywhere
                    eng.graphs.clear()
                    eng.graph_note = f"capture failed: {type(err).__name__}: {err}"
                    log.error("CUDA graph %s; every step runs eager", eng.graph_note)
                else:
                    log.info(
                        "Capture cuda graph end. Time elapsed: %.2f s. bs: %s",
                        took,
                        eng.graph_sizes,
                    )
            else:
                log.info("CUDA graphs: none (%s)", eng.graph_note)
        except Exception as err:  # noqa: BLE001 - reported on /health and in the log
            self.load_error = f"{type(err).__name__}: {err}"
            log.error("engine failed to load: %s", self.load_error)
            return
        self.engine = eng
        info = eng.info()
        log.info(
            "engine ready: variant=%s backend=%s device=%s layers=%d heads=%d kernel=%s",
            info["kernel_variant"],
            info["backend"],
            info["device_name"],
            eng.sizes.layers,
            eng.sizes.heads,
            eng.kernel_file,
        )
        self.run()

    def run(self) -> None:
        eng = self.engine
        assert eng is not None
        tokens_since, t_since = 0, time.perf_counter()
        while True:
            with self.cond:
                while not self.waiting and not self.running and self.profile_cmd is None:
                    self.cond.wait()
                cmd, self.profile_cmd = self.profile_cmd, None
                self.running = [r for r in self.running if not r.cancelled]
                while self.waiting and len(self.running) < eng.sizes.max_batch:
                    self.running.append(self.waiting.popleft())
                queued = len(self.waiting)
            if cmd is not None:
                self._profile_command(*cmd)
            if not self.running:
                continue
            batch = self.running
            self._start_pending_profile()
            try:
                tokens = eng.step(len(batch))
            except Exception as err:  # noqa: BLE001 - fail the requests, keep serving
                log.exception("decode step failed")
                for req in batch:
                    req.loop.call_soon_threadsafe(req.queue.put_nowait, f"decode failed: {err}")
                self.running = []
                continue
            self.steps += 1
            tokens_since += len(batch)
            still = []
            for req, tok in zip(batch, tokens, strict=True):
                tok = tok % engine_mod.VOCAB_SIZE
                req.output_ids.append(tok)
                req.loop.call_soon_threadsafe(req.queue.put_nowait, tok)
                if len(req.output_ids) >= req.max_new_tokens:
                    req.loop.call_soon_threadsafe(req.queue.put_nowait, None)
                else:
                    still.append(req)
            self.running = still
            if (
                self.profiler is not None
                and self.profile_pending is None
                and self.profile_steps_left is not None
            ):
                self.profile_steps_left -= 1
                if self.profile_steps_left <= 0:
                    self._stop_profile({})
            if self.steps % self.log_interval == 0:
                now = time.perf_counter()
                throughput = tokens_since / max(now - t_since, 1e-9)
                self.last_gen_throughput = throughput
                used = sum(r.prompt_tokens + len(r.output_ids) for r in batch)
                log.info(
                    "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, "
                    "cuda graph: %s, gen throughput (token/s): %.2f, #queue-req: %d",
                    len(batch),
                    used,
                    len(batch) / eng.sizes.max_batch,
                    eng.last_step_graph,
                    throughput,
                    queued,
                )
                tokens_since, t_since = 0, now

    def _profile_command(self, action: str, body: dict, done: threading.Event, answer: dict):
        try:
            answer.update(
                self._start_profile(body) if action == "start" else self._stop_profile(body)
            )
        except Exception as err:  # noqa: BLE001 - answered as HTTP 400 with the reason
            answer.update(ok=False, message=f"{type(err).__name__}: {err}")
        done.set()

    def _start_profile(self, body: dict) -> dict:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self.profiler is not None:
            return {"ok": False, "message": "Profiling is already in progress."}
        out_dir = body.get("output_dir") or os.environ.get(engine_mod.PROFILER_DIR_ENV) or "/tmp"
        os.makedirs(out_dir, exist_ok=True)
        self.profiler = profile(activities=_profiler_activities(body, torch, ProfilerActivity))
        self.profile_dir = out_dir
        steps = body.get("num_steps")
        self.profile_steps_left = int(steps) if steps else None
        # profile_by_stage: every step here is a decode step (no prefill batches), so the
        # trace is the decode stage's, named as SGLang names it
        self.profile_suffix = "-DECODE" if body.get("profile_by_stage") else ""
        start = body.get("start_step")
        if start is not None:  # as SGLang: at least the next step
            self.profile_start_at = max(int(start), self.steps + 1)
            self.profile_pending = self.profiler
            log.info("Profiling will start at step %d", self.profile_start_at)
        else:
            self.profiler.start()
        log.info("Profiling starts. Traces will be saved to: %s", out_dir)
        return {"ok": True, "message": "Start profiling.\n"}

    def _start_pending_profile(self) -> None:
        """start_step: start the waiting profiler when the step it waits for is next."""
        if self.profile_pending is not None and self.steps + 1 >= (self.profile_start_at or 0):
            self.profile_pending.start()
            self.profile_pending = self.profile_start_at = None

    def _stop_profile(self, body: dict) -> dict:
        if self.profiler is None:
            return {"ok": False, "message": "Profiling is not in progress. Call /start_profile."}
        if self.profile_pending is not None:  # stopped before its start_step: nothing traced
            self.profile_pending.start()
            self.profile_pending = self.profile_start_at = None
        prof, self.profiler = self.profiler, None
        prof.stop()
        suffix = getattr(self, "profile_suffix", "")
        path = os.path.join(self.profile_dir or "/tmp", f"{time.time()}-TP-0{suffix}.trace.json.gz")
        prof.export_chrome_trace(path)
        self.profile_steps_left = None
        log.info("Profiling done. Trace saved to: %s", path)
        return {"ok": True, "message": "Stop profiling. This will take some time.\n", "path": path}


def _profiler_activities(body: dict, torch, activity) -> list:
    """SGLang's `activities` of /start_profile: ["CPU", "GPU"] by default; ["GPU"] = GPU
    kernels only (decode kernels without the host's ranges). Without a GPU the CPU ranges are
    all there is, so they stay."""
    wanted = [str(a).upper() for a in (body.get("activities") or ["CPU", "GPU"])]
    gpu = torch.cuda.is_available()
    chosen = []
    if "CPU" in wanted or not gpu:
        chosen.append(activity.CPU)
    if gpu and ("GPU" in wanted or "CUDA" in wanted):
        chosen.append(activity.CUDA)
    return chosen


# --- requests ---------------------------------------------------------------------------


class BadRequest(ValueError):
    pass


async def _json_object(request) -> dict:
    """The request's JSON body; BadRequest unless it is an object."""
    body = await request.json()
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _prompt_tokens(text, input_ids) -> int:
    if input_ids is not None:
        if not isinstance(input_ids, list) or not all(isinstance(i, int) for i in input_ids):
            raise BadRequest("input_ids must be a list of integers")
        return len(input_ids)
    if isinstance(text, str):
        return len(text.split())
    if isinstance(text, list) and all(isinstance(i, int) for i in text):
        return len(text)  # OpenAI's prompt given as token ids
    raise BadRequest("give `text` (a string) or `input_ids` (a list of integers)")


def _positive_int(value, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _error(status: int, message: str) -> JSONResponse:
    # SGLang answers errors as {"object": "error", "message": ..., "type": ..., "code": ...}
    return JSONResponse(
        {"object": "error", "message": message, "type": "BadRequestError", "code": status},
        status_code=status,
    )


def _sse(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


class ServiceState:
    """What the SGLang info endpoints read (`sglang_api.add_routes`), over the scheduler or the
    scripted streams."""

    def __init__(self, scheduler: Scheduler, server_args: dict, scripted, tokenizer_path):
        self.scheduler = scheduler
        self.server_args = server_args
        self.streams: ScriptedStreams | None = scripted
        self.scripted = asdict(scripted.script) if scripted is not None else None
        self.tokenizer_path = tokenizer_path
        self.started = time.time()
        self.active = 0  # scripted streams in flight

    @property
    def load_error(self) -> str | None:
        return self.scheduler.load_error

    def ready(self) -> bool:
        return self.streams is not None or self.scheduler.engine is not None

    def engine_info(self) -> dict | None:
        eng = self.scheduler.engine
        return eng.info() if eng is not None else None

    def load_counts(self) -> dict:
        if self.streams is not None:
            return {"running_requests": self.active, "waiting_requests": 0}
        return self.scheduler.load_counts()

    def last_gen_throughput(self) -> float:
        return self.scheduler.last_gen_throughput

    def flush(self) -> None:
        if self.streams is not None:
            self.streams.flush()

    async def generate_one(self) -> bool:
        if self.streams is not None:
            return True
        req = GenRequest(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            prompt_tokens=1,
            max_new_tokens=1,
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
        )
        self.scheduler.submit(req)
        while True:
            item = await req.queue.get()
            if item is None:
                return True
            if isinstance(item, str):
                return False


def create_app(
    scheduler: Scheduler,
    server_args: dict,
    scripted: ScriptedStreams | None = None,
    tokenizer_path: str | None = None,
) -> FastAPI:
    app = FastAPI(title="kerneldev sandbox decode service")
    context_length = int(server_args.get("context_length") or DEFAULT_CONTEXT_LENGTH)
    state = ServiceState(scheduler, server_args, scripted, tokenizer_path)
    sglang_api.add_routes(app, state)

    def _check_length(prompt_tokens: int, max_new: int) -> None:
        total = prompt_tokens + max_new
        if total > context_length:
            raise BadRequest(
                f"the request needs {total} tokens ({prompt_tokens} prompt + {max_new} new), "
                f"more than the context length of {context_length}"
            )

    async def _enqueue(prompt_tokens: int, max_new: int) -> GenRequest:
        req = GenRequest(
            rid=uuid.uuid4().hex,
            prompt_tokens=prompt_tokens,
            max_new_tokens=max_new,
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
        )
        scheduler.submit(req)
        return req

    async def _tokens(req: GenRequest):
        while True:
            item = await req.queue.get()
            if item is None or isinstance(item, str):
                req.ended = True
            if item is None:
                return
            if isinstance(item, str):
                raise RuntimeError(item)
            yield item

    def _abort_unless_done(req: GenRequest) -> None:
        # Starlette cancels a stream whose client went away; the request must leave the batch.
        if not req.ended:
            scheduler.cancel(req)

    async def _all_tokens(req: GenRequest, request: Request) -> bool:
        """Wait for a non-streaming request to finish; False when its client hung up first
        (the request is then aborted). Uvicorn does not cancel a handler on disconnect, so the
        connection is polled."""

        async def drain() -> None:
            async for _ in _tokens(req):
                pass

        task = asyncio.ensure_future(drain())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    task.result()
                    return True
                if await request.is_disconnected():
                    task.cancel()
                    _abort_unless_done(req)
                    return False
        except asyncio.CancelledError:
            task.cancel()
            _abort_unless_done(req)
            raise

    def _not_ready() -> JSONResponse | None:
        if scheduler.engine is None:
            why = scheduler.load_error or "the engine is loading"
            return _error(503, why)
        return None

    def _meta(req: GenRequest, finished: bool) -> dict:
        return {
            "id": req.rid,
            "finish_reason": {"type": "length", "length": len(req.output_ids)}
            if finished
            else None,
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": len(req.output_ids),
            "cached_tokens": 0,
            "e2e_latency": time.perf_counter() - req.created,
        }

    @app.post("/generate")
    async def generate(request: Request):
        try:
            body = await _json_object(request)
            prompt = _prompt_tokens(body.get("text"), body.get("input_ids"))
            sp = body.get("sampling_params") or {}
            max_new = _positive_int(
                sp.get("max_new_tokens"), "max_new_tokens", DEFAULT_MAX_NEW_TOKENS
            )
            _check_length(prompt, max_new)
        except (BadRequest, ValueError) as err:
            return _error(400, str(err))
        if scripted is not None:
            return _scripted_response(prompt, max_new, bool(body.get("stream")))
        if (resp := _not_ready()) is not None:
            return resp
        req = await _enqueue(prompt, max_new)
        if not body.get("stream"):
            if not await _all_tokens(req, request):
                return _error(499, "client disconnected")
            text = "".join(token_text(t) for t in req.output_ids)
            return {"text": text, "output_ids": req.output_ids, "meta_info": _meta(req, True)}

        async def events():
            text = ""
            try:
                async for tok in _tokens(req):
                    text += token_text(tok)
                    finished = len(req.output_ids) >= req.max_new_tokens
                    yield _sse(
                        {
                            "text": text,
                            "output_ids": list(req.output_ids),
                            "meta_info": _meta(req, finished),
                            "index": 0,
                        }
                    )
                yield SSE_DONE
            finally:
                _abort_unless_done(req)

        return StreamingResponse(events(), media_type="text/event-stream")

    def _scripted_response(prompt_tokens: int, max_new: int, stream: bool):
        fails = scripted.admit()

        async def events():
            state.active += 1
            try:
                async for payload in scripted.events(prompt_tokens, max_new, token_text, fails):
                    yield _sse(payload)
                yield SSE_DONE
            finally:
                state.active -= 1

        if not stream:
            return _error(400, "scripted-stream mode serves streaming /generate only")
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await _json_object(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            prompt_tokens = _prompt_tokens(prompt, None)
            max_new = _positive_int(body.get("max_tokens"), "max_tokens", DEFAULT_MAX_TOKENS)
            _check_length(prompt_tokens, max_new)
        except (BadRequest, ValueError) as err:
            return _error(400, str(err))
        if (resp := _not_ready()) is not None:
            return resp
        req = await _enqueue(prompt_tokens, max_new)
        model = body.get("model") or MODEL_NAME
        cid, created = f"cmpl-{req.rid}", int(time.time())

        def usage() -> dict:
            n = len(req.output_ids)
            return {
                "prompt_tokens": req.prompt_tokens,
                "completion_tokens": n,
                "total_tokens": req.prompt_tokens + n,
            }

        def chunk(choices: list, **extra) -> dict:
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": choices,
                **extra,
            }

        if not body.get("stream"):
            if not await _all_tokens(req, request):
                return _error(499, "client disconnected")
            text = "".join(token_text(t) for t in req.output_ids)
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            return chunk([choice], usage=usage())

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events():
            try:
                async for tok in _tokens(req):
                    finished = len(req.output_ids) >= req.max_new_tokens
                    choice = {
                        "index": 0,
                        "text": token_text(tok),
                        "logprobs": None,
                        "finish_reason": "length" if finished else None,
                    }
                    yield _sse(chunk([choice]))
                if include_usage:
                    yield _sse(chunk([], usage=usage()))
                yield SSE_DONE
            finally:
                _abort_unless_done(req)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def _profile(action: str, request: Request):
        if (resp := _not_ready()) is not None:
            return resp
        try:
            raw = await request.body()
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return _error(400, "the body must be JSON (or empty)")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        answer = await asyncio.to_thread(scheduler.profile, action, body)
        status = 200 if answer.get("ok") else 400
        return PlainTextResponse(answer.get("message", ""), status_code=status)

    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(request: Request):
        return await _profile("start", request)

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile(request: Request):
        return await _profile("stop", request)

    return app


# --- entry --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m kerneldev.sandbox.service",
        description="kerneldev's sandbox decode service (SGLang API subset).",
    )
    p.add_argument("--root", required=True, help="the live SGLang tree holding the kernel file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--layers", type=int, help="attention layers per step (default by device)")
    p.add_argument("--max-batch", type=int, help="most requests per step (default by device)")
    p.add_argument(
        "--decode-log-interval", type=int, default=40, help="steps between decode log lines"
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=DEFAULT_CONTEXT_LENGTH,
        help="most prompt + new tokens per request (longer requests are a 400)",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    p.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        help="largest batch replayed from a CUDA graph (default: SGLang's for an H200 at TP 1, "
        f"256, capped at --max-batch; or ${engine_mod.GRAPH_MAX_BS_ENV})",
    )
    p.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help=f"every step eager (also ${engine_mod.DISABLE_GRAPH_ENV}=1)",
    )
    p.add_argument(
        "--tokenizer-path",
        default=os.environ.get(TOKENIZER_ENV),
        help="reported as /model_info's tokenizer_path, where SGLang's client loads its "
        f"tokenizer (default ${TOKENIZER_ENV})",
    )
    p.add_argument(
        "--scripted-stream",
        default=os.environ.get(SPEC_ENV),
        metavar="SPEC",
        help="no engine: /generate streams on a fixed timetable, e.g. "
        f"'chunk_tokens=3,gap_ms=60,first_ms=60,error_request=2,error_after=1' (or ${SPEC_ENV})",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    if args.scripted_stream is not None:
        return _main_scripted(args)
    import torch  # does not import triton

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        # Must precede the first `import triton`: the interpreter is chosen at import time.
        os.environ["TRITON_INTERPRET"] = "1"
        import warnings

        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.")
    base = engine_mod.CUDA_SIZES if device == "cuda" else engine_mod.CPU_SIZES
    overrides = {}
    if args.layers:
        overrides["layers"] = args.layers
    if args.max_batch:
        overrides["max_batch"] = args.max_batch
    from dataclasses import replace

    sizes = replace(base, **overrides)
    scheduler = Scheduler(args.decode_log_interval)
    server_args = _server_args(args, device, sizes.max_batch)
    app = create_app(scheduler, server_args, tokenizer_path=args.tokenizer_path)
    graph_options = {
        "cuda_graph_max_bs": args.cuda_graph_max_bs,
        "disable_cuda_graph": args.disable_cuda_graph,
    }
    threading.Thread(
        target=scheduler.load,
        args=(args.root, sizes, graph_options),
        name="scheduler",
        daemon=True,
    ).start()

    import uvicorn

    log.info("sandbox decode service on http://%s:%d (loading the engine)", args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


def _server_args(args: argparse.Namespace, device: str, max_batch: int) -> dict:
    return {
        "model_path": MODEL_NAME,
        "served_model_name": MODEL_NAME,
        "tokenizer_path": args.tokenizer_path,
        "host": args.host,
        "port": args.port,
        "device": device,
        "max_running_requests": max_batch,
        "decode_log_interval": args.decode_log_interval,
        "context_length": args.context_length,
    }


def _main_scripted(args: argparse.Namespace) -> None:
    """Scripted-stream mode: no torch, no engine (scripted.py)."""
    try:
        script = StreamScript.parse(args.scripted_stream)
    except ValueError as err:
        raise SystemExit(f"sandbox_service: {err}") from None
    import uvicorn

    server_args = _server_args(args, "none (scripted streams)", 0)
    app = create_app(
        Scheduler(args.decode_log_interval),
        server_args,
        scripted=ScriptedStreams(script),
        tokenizer_path=args.tokenizer_path,
    )
    log.info("sandbox decode service on http://%s:%d (scripted streams: %s)",
             args.host, args.port, script)  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
