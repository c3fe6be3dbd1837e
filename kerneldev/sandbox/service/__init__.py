"""The sandbox's decode service: a small SGLang stand-in that runs the live kernel files.

It speaks the subset of SGLang's HTTP API that kerneldev and SGLang's own benchmark client use
(`/health`, `/health_generate`, `/v1/models`, `/model_info`, `/server_info`, `/flush_cache`,
`/generate`, `/v1/completions`, `/start_profile`, `/stop_profile`) with SGLang 0.5.23's request
and response shapes and field names, and decodes for real (in CUDA graphs on a GPU, as
SGLang): every step runs a stack of DSv4 sparse-decode attention layers over a synthetic paged
FP8 cache, all in-flight requests batched into one kernel call per layer, plus a little glue
(a GEMM, elementwise work, a "sampling" reduction).

- `engine.py`: the model stand-in (no HTTP): loads `flash_mla_sm120_triton.py` from the live
  tree, builds the inputs, runs one decode step for a batch.
- `app.py`: the FastAPI app, the continuous-batching scheduler thread, the profiler and the
  SGLang-style decode log lines; `python -m kerneldev.sandbox.service --help` starts it.
- `sglang_api.py`: the informational routes (models, model and server info, flush, health).
- `launcher.py`: how the sandbox's restart.sh starts it on CPU: a resident launcher per
  environment imports torch, triton and the HTTP stack once and forks a fresh worker per
  restart (which then reads the env file and imports the live kernel file, as a fresh start).
- `scripted.py`: scripted-stream mode, a fixed timetable instead of the engine (for checking
  what benchmark clients compute).

Needs the `service` extra (fastapi, uvicorn) and the `kernels` extra (torch, triton). On a
CPU-only machine the kernels run under the Triton interpreter on tiny sizes.
"""
