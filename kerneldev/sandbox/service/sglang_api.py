"""SGLang's informational endpoints for the sandbox service, with SGLang 0.5.23's field names.

What SGLang's client (`sglang.benchmark.serving`) and kerneldev call besides `/generate`:

    GET  /v1/models, /v1/models/{id}   the OpenAI model list: `data[0].id` is the model name
                                       (the client's readiness check and its default --model;
                                       503 until the engine is ready, like every route here)
    GET  /model_info, /get_model_info  model_path, served_model_name, tokenizer_path (where the
                                       client loads its tokenizer from), is_generation, ...
    GET  /server_info, /get_server_info  the server's settings (tp_size, attention_backend,
                                       speculative_algorithm, disable_cuda_graph,
                                       cuda_graph_max_bs_decode, cuda_graph_bs_decode, ...),
                                       internal_states, version; plus `kerneldev` (variant,
                                       kernel file, device, CUDA graphs) - SGLang has no such key
    GET/POST /flush_cache              200 "Cache flushed..." when idle; 400 when requests are
                                       running after `?timeout=` seconds (SGLang's answer)
    GET  /health                       200 with an empty body once ready (503 before)
    GET  /health_generate              200 after a 1-token generation went through
    GET  /ready                        200 once ready

The sandbox has no radix cache, so a flush changes nothing in its timings; it answers as SGLang
does so that clients take the same path (and, in scripted-stream mode, it restarts the count of
requests that picks the failing one).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

SANDBOX_VERSION = "0.5.23-kerneldev-sandbox"  # SGLang's API as of 0.5.23
HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's HEALTH_CHECK_TIMEOUT
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


def settings(server_args: dict, engine_info: dict | None) -> dict:
    """SGLang's names for the sandbox's settings (one GPU, no speculative decoding)."""
    graphs = (engine_info or {}).get("cuda_graph") or {}
    batch_sizes = graphs.get("batch_sizes") or None
    backend = (engine_info or {}).get("backend", "triton")
    return {
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "enable_dp_attention": False,
        "attention_backend": f"flashmla_sm120_{backend}",
        "decode_attention_backend": f"flashmla_sm120_{backend}",
        "kv_cache_dtype": "fp8_e4m3",
        "speculative_algorithm": None,
        "speculative_num_steps": None,
        "speculative_eagle_topk": None,
        "speculative_num_draft_tokens": None,
        "stream_interval": 1,
        "disable_cuda_graph": not graphs.get("enabled", False),
        "disable_cuda_graph_padding": False,
        "cuda_graph_max_bs_decode": graphs.get("max_bs"),
        "cuda_graph_bs_decode": batch_sizes,
        # The spellings of SGLang releases before the per-phase CUDA-graph settings.
        "cuda_graph_max_bs": graphs.get("max_bs"),
        "cuda_graph_bs": batch_sizes,
    }


def add_routes(app: FastAPI, service) -> None:
    """`service` is the app's state: `.ready()`, `.load_error`, `.engine_info()`,
    `.load_counts()`, `.server_args`, `.tokenizer_path`, `.started`, `.flush()`,
    `.generate_one()` (a 1-token request; True when it finished)."""

    def not_ready() -> Response | None:
        if service.ready():
            return None
        return PlainTextResponse(service.load_error or "loading", status_code=503)

    def model_name() -> str:
        return service.server_args["served_model_name"]

    def model_card(name: str) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": int(service.started),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": service.server_args.get("context_length"),
        }

    # SGLang serves HTTP only once its model is loaded, so every route below answers only when
    # the engine is ready (503 before): SGLang's client waits on /v1/models for exactly that.
    @app.get("/v1/models")
    async def models():
        if (resp := not_ready()) is not None:
            return resp
        return {"object": "list", "data": [model_card(model_name())]}

    @app.get("/v1/models/{model:path}")
    async def one_model(model: str):
        if (resp := not_ready()) is not None:
            return resp
        if model != model_name():
            return JSONResponse(
                {
                    "error": {
                        "message": f"The model '{model}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
                status_code=404,
            )
        return model_card(model)

    def model_info_body():
        if (resp := not_ready()) is not None:
            return resp
        return {
            "model_path": service.server_args["model_path"],
            "served_model_name": model_name(),
            "tokenizer_path": service.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "dummy",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "kerneldev_sandbox_dsv4",
            "architectures": ["KerneldevSandboxDecode"],
        }

    app.get("/model_info")(model_info_body)
    app.get("/get_model_info")(model_info_body)

    async def server_info_body():
        info = dict(service.server_args)
        engine_info = service.engine_info()
        info.update(settings(service.server_args, engine_info))
        counts = service.load_counts()
        info["internal_states"] = [
            {
                "avg_spec_accept_length": None,
                "last_gen_throughput": service.last_gen_throughput(),
                "num_running_reqs": counts.get("running_requests", 0),
                "num_waiting_reqs": counts.get("waiting_requests", 0),
            }
        ]
        info["startup_time"] = service.started
        info["version"] = SANDBOX_VERSION
        info["frontend"] = "python"
        kd = {"ready": service.ready(), "load_error": service.load_error, **counts}
        if engine_info:
            kd.update(engine_info)
        if service.scripted is not None:
            kd["scripted_stream"] = service.scripted
        info["kerneldev"] = kd
        return info

    app.get("/server_info")(server_info_body)
    app.get("/get_server_info")(server_info_body)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(timeout: float = 0.0):
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            counts = service.load_counts()
            if not counts.get("running_requests") and not counts.get("waiting_requests"):
                service.flush()
                return PlainTextResponse(FLUSHED)
            if time.monotonic() >= deadline:
                return PlainTextResponse(
                    "Cache not flushed because there are pending requests. "
                    f"#queue-req: {counts.get('waiting_requests', 0)}, "
                    f"#running-req: {counts.get('running_requests', 0)}\n",
                    status_code=400,
                )
            await asyncio.sleep(0.05)

    @app.get("/health")
    async def health():
        return not_ready() or Response(status_code=200)

    @app.get("/ready")
    async def ready():
        return Response(status_code=200 if service.ready() else 503)

    @app.get("/health_generate")
    async def health_generate(request: Request):
        if (resp := not_ready()) is not None:
            return resp
        try:
            ok = await asyncio.wait_for(service.generate_one(), HEALTH_GENERATE_TIMEOUT_S)
        except (asyncio.TimeoutError, RuntimeError):
            ok = False
        return Response(status_code=200 if ok else 503)
