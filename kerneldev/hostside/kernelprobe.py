"""Which backend the live sm_120 wrapper's entry really reaches: the host side of
`kerneldev kernels status`.

Self-contained on purpose, like `_importscan.py`: kerneldev sends this source to the host and
runs it with the host's Python, in the service's environment (`service.env_file`), from the
live tree's import root, without writing bytecode (request as JSON on stdin, answer as JSON on
stdout). It imports the live wrapper exactly as the server does (the wrapper reads its
SGLANG_SM120_* switch at import), then calls `flash_mla_with_kvcache_sm120(**kwargs)` on tiny
CPU tensors with every candidate backend intercepted; the first one reached is the answer, and
nothing is computed:

- torch: the wrapper's `_sm120_sparse_decode_fwd` (SGLang's PyTorch fallback);
- triton: `flash_mla_sparse_decode_triton`, in the kernel file and wherever the wrapper bound it
  (the Triton variant, mma or simt, is the kernel module's `_DEFAULT_VARIANT` when it has one:
  kerneldev's kernels read SGLANG_SM120_MMA_FLASHMLA at import);
- flashinfer: any `import flashinfer...` statement run during the call (SGLang imports
  FlashInfer inside the call), and any wrapper global that FlashInfer defined.

Two calls: a decode step (few tokens, at the decode head count) and a prefill-sized call (more
than 64 query tokens: SGLang 0.5.23 sends those to FlashInfer's prefill kernel, at the layer's
real head count). A wrapper that cannot be imported, or an entry that fails before reaching a
candidate, is reported with the error (`backend: null`).
"""

import builtins
import importlib
import json
import os
import sys
import traceback

KERNEL_FILE_ENTRY = "flash_mla_sparse_decode_triton"
TORCH_ENTRY = "_sm120_sparse_decode_fwd"
ENTRY = "flash_mla_with_kvcache_sm120"


class Reached(BaseException):
    """Raised by an intercepted backend; a BaseException so no `except Exception` eats it."""

    def __init__(self, backend, function, variant=None):
        BaseException.__init__(self, backend)
        self.backend = backend
        self.function = function
        self.variant = variant


class _FlashInferTrap:
    """While armed, stops the call at the first `import flashinfer...` / `from flashinfer...`
    statement (replaces `builtins.__import__`, so modules imported earlier are caught too)."""

    def __init__(self):
        self.armed = False
        self.original = builtins.__import__

    def __call__(self, name, globals=None, locals=None, fromlist=(), level=0):
        if self.armed and level == 0 and name.split(".")[0] == "flashinfer":
            what = name + ("." + ",".join(fromlist) if fromlist else "")
            caller = sys._getframe(1).f_code.co_name
            raise Reached("flashinfer", what + " (imported by " + caller + ")")
        return self.original(name, globals, locals, fromlist, level)


def _flashinfer_present():
    """Where FlashInfer's sm_120 sparse MLA lives on this Python (found, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("flashinfer")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        for rel in ("mla/_sparse_mla_sm120.py", "sparse_mla_sm120.py", "sparse_mla_sm120"):
            if os.path.exists(os.path.join(folder, rel)):
                return os.path.join(folder, rel)
    return ""


def _trap(backend, function, variant_of=None):
    def intercepted(*args, **kwargs):
        variant = kwargs.get("variant") or (variant_of() if variant_of else None)
        raise Reached(backend, function, variant)

    return intercepted


def _inputs(torch, tokens, heads):
    page_size, bytes_per_token, topk = 64, 584, 8
    return dict(
        q=torch.zeros(tokens, 1, heads, 512, dtype=torch.bfloat16),
        k_cache=torch.zeros(1, page_size, 1, bytes_per_token, dtype=torch.uint8).view(
            torch.float8_e4m3fn
        ),
        indices=torch.zeros(tokens, 1, topk, dtype=torch.int32),
        topk_length=torch.full((tokens,), topk, dtype=torch.int32),
        attn_sink=torch.zeros(heads, dtype=torch.float32),
        head_dim_v=512,
        softmax_scale=512**-0.5,
        extra_k_cache=None,
        extra_indices_in_kvcache=None,
        extra_topk_length=None,
    )


def probe(request):
    answer = {"imported": False, "calls": [], "error": None, "switch": {}}
    for key in sorted(os.environ):
        if key.startswith("SGLANG_SM120_"):
            answer["switch"][key] = os.environ[key]
    try:
        import torch

        wrapper = importlib.import_module(request["wrapper"])
    except BaseException as err:  # the server would fail the same way
        answer["error"] = f"{type(err).__name__}: {err}"
        answer["traceback"] = traceback.format_exc()[-2000:]
        return answer
    answer["imported"] = True
    answer["wrapper_file"] = getattr(wrapper, "__file__", None)
    for name in ("_sm120_default_backend", "SM120_DECODE_MAX_TOKENS"):
        if isinstance(getattr(wrapper, name, None), (str, int)):
            answer[name] = getattr(wrapper, name)
    found = _flashinfer_present()
    answer["flashinfer"] = found
    entry = getattr(wrapper, ENTRY, None)
    if entry is None:
        answer["error"] = f"the wrapper defines no {ENTRY}"
        return answer

    kernel = None
    try:
        kernel = importlib.import_module(request["kernel"])
    except BaseException as err:
        answer["kernel_error"] = f"{type(err).__name__}: {err}"

    def variant():
        value = getattr(kernel, "_DEFAULT_VARIANT", None)
        return value if isinstance(value, str) else None

    patched = []
    for module in (wrapper, kernel):
        if module is None:
            continue
        if hasattr(module, KERNEL_FILE_ENTRY):
            patched.append((module, KERNEL_FILE_ENTRY, getattr(module, KERNEL_FILE_ENTRY)))
            setattr(
                module,
                KERNEL_FILE_ENTRY,
                _trap("triton", module.__name__ + "." + KERNEL_FILE_ENTRY, variant),
            )
    if hasattr(wrapper, TORCH_ENTRY):
        patched.append((wrapper, TORCH_ENTRY, getattr(wrapper, TORCH_ENTRY)))
        setattr(wrapper, TORCH_ENTRY, _trap("torch", wrapper.__name__ + "." + TORCH_ENTRY))
    for name, value in list(vars(wrapper).items()):
        if callable(value) and str(getattr(value, "__module__", "")).startswith("flashinfer"):
            patched.append((wrapper, name, value))
            setattr(wrapper, name, _trap("flashinfer", value.__module__ + "." + name))

    trap = _FlashInferTrap()
    builtins.__import__ = trap
    try:
        for call in request["calls"]:
            record = {"call": call["name"], "tokens": call["tokens"], "heads": call["heads"]}
            record.update(backend=None, function=None, variant=None, error=None)
            trap.armed = True
            try:
                entry(**_inputs(torch, call["tokens"], call["heads"]))
                record["error"] = "the entry returned without reaching a known backend"
            except Reached as hit:
                record.update(backend=hit.backend, function=hit.function, variant=hit.variant)
            except BaseException as err:
                record["error"] = f"{type(err).__name__}: {err}"
            finally:
                trap.armed = False
            answer["calls"].append(record)
    finally:
        builtins.__import__ = trap.original
        for module, name, value in patched:
            setattr(module, name, value)
    return answer


def main():
    request = json.loads(sys.stdin.read())
    sys.path.insert(0, os.getcwd())
    sys.stdout.write(json.dumps(probe(request)) + "\n")


if __name__ == "__main__":
    main()
