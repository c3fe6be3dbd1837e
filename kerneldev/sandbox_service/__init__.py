"""The sandbox's decode service: a small SGLang stand-in that runs the live kernel files.

It speaks the subset of SGLang's HTTP API that kerneldev uses (`/health`, `/get_server_info`,
`/generate`, `/v1/completions`, `/start_profile`, `/stop_profile`) with SGLang's request and
response shapes, and decodes for real: every step runs a stack of DSv4 sparse-decode attention
layers over a synthetic paged FP8 cache, all in-flight requests batched into one kernel call
per layer, plus a little glue (a GEMM, elementwise work, a "sampling" reduction).

- `engine.py`: the model stand-in (no HTTP): loads `flash_mla_sm120_triton.py` from the live
  tree, builds the inputs, runs one decode step for a batch.
- `app.py`: the FastAPI app, the continuous-batching scheduler thread, the profiler and the
  SGLang-style decode log lines; `python -m kerneldev.sandbox_service --help` starts it.

Needs the `service` extra (fastapi, uvicorn) and the `kernels` extra (torch, triton). On a
CPU-only machine the kernels run under the Triton interpreter on tiny sizes.
"""
