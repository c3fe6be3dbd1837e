"""The model stand-in of the sandbox service: L sparse-decode attention layers and some glue.

The kernel file is imported from the live tree (`<root>/python/sglang/srt/layers/attention/
flash_mla_sm120_triton.py`) by path, at start, so what `kerneldev push` deployed is what runs.
Its entry `flash_mla_sparse_decode_triton` is called with `variant=None`: the file picks SIMT
or MMA from `SGLANG_SM120_MMA_FLASHMLA`, read when it is imported, as in SGLang.

Inputs come from the bundled `dsv4_reference.make_inputs` (one synthetic paged FP8 cache per
layer, sized for `max_batch` requests); a step for B requests uses the first B rows. Per layer:

    attention   flash_mla_sparse_decode_triton(q[:B], caches...)     (the kernel under test)
    glue        out.view(B*H, 512) @ W_o (GEMM), scale + residual (elementwise), copy into q
    sampling    one reduction per request -> the next token id (a host sync, as a server has)

CUDA graphs, as SGLang decodes: on a GPU the whole step above (every layer and the sampling
reduction, up to the token ids on the device) is captured once per batch size of SGLang
0.5.23's decode list for a server without speculative decoding, `decode_graph_batch_sizes`:
1, 2, 4, 8, 12, 16, 24, 32, ... (every 8 up to 256), 272, 288, ... (every 16 below 512), then
every 32, cut at `cuda_graph_max_bs`, which is added when missing. A step for B requests
replays the graph of the smallest captured size >= B (the rows past B are padding, as SGLang
pads a batch) and copies the B token ids to the host; B above `cuda_graph_max_bs` runs eager.
The default `cuda_graph_max_bs` is SGLang's for a 1-GPU server on a 90-160 GB GPU (H200,
H20): 256, capped at the most running requests (`max_batch`, 128 here) as SGLang caps it: 128.
`--disable-cuda-graph` (or KERNELDEV_SANDBOX_DISABLE_CUDA_GRAPH=1 in the env file, so a
variant can switch it) runs every step eager; on CPU there are no graphs.

On CUDA the sizes are the contract's production decode shape (H 64, main topk 128 on pages of
256, extra topk 512 on pages of 64). On CPU the same code runs tiny sizes under the Triton
interpreter (TRITON_INTERPRET=1 must be set before triton is imported; `app.main` does, and
so does the sandbox's resident launcher, launcher.py, which imports torch and triton once and
forks a worker per restart: this module and the kernel file are then loaded in the worker, after
the restart's environment is in place, so the file is what was pushed and the switches are the
env file's). There the interpreter runs with `kernels/interpreter_overhead.py`'s trims (work per
`tl` operation that computes nothing; the token ids are bit-identical without them), and
`info()["interpreter_trims"]` (in /get_server_info) says whether they were applied.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import asdict, dataclass

KERNEL_RELPATH = "python/sglang/srt/layers/attention/flash_mla_sm120_triton.py"
ENTRY_POINT = "flash_mla_sparse_decode_triton"
VARIANT_ENV = "SGLANG_SM120_MMA_FLASHMLA"
BACKEND_ENV = "SGLANG_SM120_FLASHMLA_BACKEND"
PROFILER_DIR_ENV = "SGLANG_TORCH_PROFILER_DIR"
DISABLE_GRAPH_ENV = "KERNELDEV_SANDBOX_DISABLE_CUDA_GRAPH"
GRAPH_MAX_BS_ENV = "KERNELDEV_SANDBOX_CUDA_GRAPH_MAX_BS"
# The environment the service reads.
SWITCHES = (VARIANT_ENV, BACKEND_ENV, PROFILER_DIR_ENV, DISABLE_GRAPH_ENV, GRAPH_MAX_BS_ENV)
SGLANG_DEFAULT_GRAPH_MAX_BS = 256  # SGLang 0.5.23, a 90-160 GB GPU at TP < 4 (H200, H20)
BACKENDS = ("triton",)  # the sandbox has no FlashInfer; asking for it fails at start
VOCAB_SIZE = 1000

# record_function / kernel names the profile summary groups by family.
RANGE_ATTENTION = "sparse_decode_attention"
RANGE_GEMM = "glue_gemm_o_proj"
RANGE_ELEMENTWISE = "glue_elementwise_residual"
RANGE_SAMPLING = "glue_sampling"


@dataclass(frozen=True)
class EngineSizes:
    layers: int
    heads: int
    topk: int
    page_size: int
    extra_topk: int
    extra_page_size: int
    max_batch: int


# The contract's production decode shape (docs/kernel-contract.md).
CUDA_SIZES = EngineSizes(
    layers=8, heads=64, topk=128, page_size=256, extra_topk=512, extra_page_size=64, max_batch=128
)
# Interpreter-sized: a SIMT step for 4 requests takes a few hundred ms on one core.
CPU_SIZES = EngineSizes(
    layers=1, heads=2, topk=8, page_size=16, extra_topk=8, extra_page_size=16, max_batch=16
)


def decode_graph_batch_sizes(max_bs: int) -> list[int]:
    """SGLang 0.5.23's decode CUDA-graph batch sizes (no speculative decoding, padding on)."""
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
    sizes += list(range(512, max_bs + 1, 32))
    sizes = [b for b in sizes if b <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def padded_batch(batch: int, captured: list[int]) -> int | None:
    """The smallest captured size >= batch (SGLang's padding), None above them all."""
    return next((b for b in captured if b >= batch), None)


class EngineError(RuntimeError):
    """The engine cannot start (kernel file missing or broken, unknown backend)."""


def kernel_path(root: str) -> str:
    return os.path.join(root, KERNEL_RELPATH)


def _load_kernel_module(path: str):
    if not os.path.isfile(path):
        raise EngineError(f"no kernel file at {path}")
    spec = importlib.util.spec_from_file_location("_sandbox_live_flash_mla_sm120_triton", path)
    if spec is None or spec.loader is None:
        raise EngineError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    # No __pycache__ in the live tree: it would hold bytes nobody pushed, and a pushed file of
    # the same size within the same second as the cached one would run the old bytecode.
    writes_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a broken push must show up as a failed start, with the reason
        raise EngineError(f"importing {path} failed: {type(err).__name__}: {err}") from err
    finally:
        sys.dont_write_bytecode = writes_bytecode
    if not callable(getattr(module, ENTRY_POINT, None)):
        raise EngineError(f"{path} has no function {ENTRY_POINT}()")
    return module


class DecodeEngine:
    """Owns the device tensors; `step(batch)` runs one decode step for the first `batch` rows
    and returns one next-token id per row. Not thread-safe: one scheduler thread calls it."""

    def __init__(
        self,
        root: str,
        sizes: EngineSizes | None = None,
        device: str | None = None,
        *,
        cuda_graph_max_bs: int | None = None,
        disable_cuda_graph: bool = False,
    ):
        import torch

        from kerneldev.kernels.dsv4_reference import make_inputs

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.sizes = sizes or (CUDA_SIZES if self.device == "cuda" else CPU_SIZES)
        self.backend = os.environ.get(BACKEND_ENV, "triton") or "triton"
        if self.backend not in BACKENDS:
            raise EngineError(
                f"{BACKEND_ENV}={self.backend}: the sandbox service only has the Triton "
                f"kernels ({', '.join(BACKENDS)})"
            )
        self.env = {k: os.environ.get(k) for k in SWITCHES}
        self.interpreter_trims = False
        if self.device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
            # The interpreter's per-operation work that computes nothing (the module says
            # what; token ids are bit-identical with and without): ~half of a CPU step.
            from kerneldev.kernels.interpreter_overhead import trim_interpreter_overhead

            self.interpreter_trims = trim_interpreter_overhead()
        self.kernel_file = kernel_path(root)
        with open(self.kernel_file, "rb") as f:
            self.kernel_sha256 = hashlib.sha256(f.read()).hexdigest()
        self.module = _load_kernel_module(self.kernel_file)
        self.entry = getattr(self.module, ENTRY_POINT)
        # The file's own choice (read from SGLANG_SM120_MMA_FLASHMLA at import).
        self.variant = getattr(self.module, "_DEFAULT_VARIANT", None) or (
            "mma" if os.environ.get(VARIANT_ENV, "0") == "1" else "simt"
        )

        s = self.sizes
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.layers = []
        for layer in range(s.layers):
            inputs = make_inputs(
                s.max_batch,
                s.heads,
                s.topk,
                s.page_size,
                extra_topk=s.extra_topk,
                extra_page_size=s.extra_page_size,
                device=self.device,
                seed=layer,
            )
            w_o = (torch.randn(512, 512, generator=gen) / 512**0.5).to(torch.bfloat16)
            self.layers.append((inputs, w_o.to(self.device)))
        self.q = self.layers[0][0]["q"].clone()  # the running hidden state, [max_batch, 1, H, 512]
        self.gamma = torch.full((512,), 0.5, dtype=torch.bfloat16, device=self.device)
        self.graphs: dict[int, tuple] = {}  # batch size -> (CUDAGraph, token ids on the device)
        self.graph_note = self._graph_plan(cuda_graph_max_bs, disable_cuda_graph)
        self.last_step_graph = False

    def _graph_plan(self, max_bs: int | None, disable: bool) -> str:
        """Sets graph_max_bs / graph_sizes; returns why there are none ("" when there are)."""
        env_max = os.environ.get(GRAPH_MAX_BS_ENV)
        if max_bs is None and env_max:
            try:
                max_bs = int(env_max)
            except ValueError:
                raise EngineError(f"{GRAPH_MAX_BS_ENV}={env_max}: not an integer") from None
        disable = disable or os.environ.get(DISABLE_GRAPH_ENV, "0") not in ("", "0")
        if max_bs is None:
            max_bs = min(SGLANG_DEFAULT_GRAPH_MAX_BS, self.sizes.max_batch)
        if max_bs < 1:
            raise EngineError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
        self.graph_max_bs = min(max_bs, self.sizes.max_batch)
        self.graph_sizes: list[int] = []
        if self.device != "cuda":
            return "no CUDA graphs on CPU"
        if disable:
            return "disabled (--disable-cuda-graph)"
        self.graph_sizes = decode_graph_batch_sizes(self.graph_max_bs)
        return ""

    def capture_graphs(self) -> float:
        """Capture one graph per size of graph_sizes (largest first, one memory pool, as
        SGLang captures); returns the seconds it took. Each size runs eager twice first
        (Triton compiles, cuBLAS picks its kernels)."""
        torch = self.torch
        if not self.graph_sizes:
            return 0.0
        import time

        start = time.perf_counter()
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.graph_sizes):
                for _ in range(2):
                    self._forward(bs)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for bs in reversed(self.graph_sizes):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                tokens = self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = (graph, tokens)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def info(self) -> dict:
        return {
            "device": self.device,
            "device_name": self._device_name(),
            "kernel_variant": self.variant,
            "backend": self.backend,
            "kernel_file": self.kernel_file,
            "kernel_sha256": self.kernel_sha256,
            "env": dict(self.env),
            "interpreter_trims": self.interpreter_trims,
            "sizes": asdict(self.sizes),
            "cuda_graph": {
                "enabled": bool(self.graphs),
                "max_bs": self.graph_max_bs if self.graphs else None,
                "batch_sizes": sorted(self.graphs),
                "note": self.graph_note,
            },
        }

    def _device_name(self) -> str:
        if self.device == "cuda":
            return self.torch.cuda.get_device_name(0)
        return "cpu (Triton interpreter)"

    def step(self, batch: int) -> list[int]:
        """One decode step for rows [0, batch): a graph replay of the padded batch when one is
        captured, else eager; returns one next-token id per row (the host sync a server has)."""
        if not 0 < batch <= self.sizes.max_batch:
            raise ValueError(f"batch must be 1..{self.sizes.max_batch}, got {batch}")
        padded = padded_batch(batch, sorted(self.graphs)) if self.graphs else None
        self.last_step_graph = padded is not None
        if padded is not None:
            graph, tokens = self.graphs[padded]
            graph.replay()
            return [int(t) for t in tokens[:batch].tolist()]
        return [int(t) for t in self._forward(batch).tolist()]

    def _forward(self, batch: int):
        """L attention layers with glue, then sampling, for rows [0, batch); the token ids stay
        on the device (so the step can be captured in a CUDA graph)."""
        torch = self.torch
        from torch.profiler import record_function

        B, H = batch, self.sizes.heads
        hidden = self.q[:B]
        for inputs, w_o in self.layers:
            args = {k: v for k, v in inputs.items() if k != "q"}
            for key in ("indices", "topk_length", "extra_indices", "extra_topk_length"):
                if args[key] is not None:
                    args[key] = args[key][:B]
            with record_function(RANGE_ATTENTION):
                out, _lse = self.entry(hidden, **args)
            with record_function(RANGE_GEMM):
                proj = out.view(B * H, 512) @ w_o
            with record_function(RANGE_ELEMENTWISE):
                mixed = (proj.view(B, 1, H, 512) * self.gamma + hidden).clamp_(-1.0, 1.0)
                hidden = mixed.to(torch.bfloat16)
        with record_function(RANGE_SAMPLING):
            scores = hidden.view(B, H * 512)[:, :VOCAB_SIZE].float()
            tokens = scores.argmax(dim=-1)
        self.q[:B].copy_(hidden)
        return tokens
