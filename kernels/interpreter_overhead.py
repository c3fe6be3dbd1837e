"""Trim costs of Triton's CPU interpreter that compute nothing a kernel's outputs depend on.

Under TRITON_INTERPRET=1 Triton executes every `tl` operation in Python, once per program of
the grid. Profiled on the kernel test `test_matches_reference[h128-simt-table]` (triton 3.9),
half of that time produced no value:

* Every call of a nested `@triton.jit` helper re-runs `_patch_lang(fn)`, which scans the
  `triton.language` modules with `inspect.getmembers` to swap their builtins for interpreted
  ones (~30% of the run). What it does depends only on `fn.__globals__`, and the launch has
  already patched those modules: a second pass finds no builtin left to swap and re-sets the
  same stateless wrappers. The nested scopes are never restored (the launch's scope restores
  the originals), so skipping a repeat for globals already patched in the running launch
  leaves the patched state, and what every operation computes, as it was.
* Integer `+ - *` run the overflow sanitizer (`sanitize_overflow`, on in the interpreter's
  options): it redoes the operation in int64 and compares against the int32 range, then hands
  the result to `device_assert`, which returns at once because the interpreter's `debug`
  option is False (its default; nothing in the interpreter sets it) (~19%). With `debug` off
  the check asserts nothing, so turning it off there drops work and no check.
* `_get_np_dtype` (the numpy storage type of a Triton type, asked for by most operations)
  rebuilds a 19-entry dict on every call (~5%); its answer depends only on the scalar type,
  so it is looked up once per scalar type.

All are applied only when the interpreter is in use (TRITON_INTERPRET=1) and its internals have
the shape described above (checked here); otherwise nothing changes and the run is just slower.
Compiled kernels on a GPU never go through this module, and its callers call it only on their
CPU path: the sandbox decode service on CPU (`kerneldev/sandbox/service/engine.py`), the
harness's `--cpu-mode` (`dsv4_bench.py`, which this file travels with to the host: it needs
only the standard library and triton) and the kernel tests without a GPU
(`tests/kernels/conftest.py`). The outputs are bit-identical with and without the trims
(docs/benchmarks.md, "The interpreter trims in the child processes").
"""

from __future__ import annotations

import dataclasses
import os


def trim_interpreter_overhead() -> bool:
    """Apply the trims to the Triton interpreter of this process; True if they were applied.
    Nothing happens unless TRITON_INTERPRET=1 (the interpreter is what runs the kernels)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        from triton.runtime import interpreter as ti
    except ImportError:
        return False
    if getattr(ti, "_kd_overhead_trimmed", False):
        return True
    get_np_dtype = getattr(ti, "_get_np_dtype", None)
    executor = getattr(ti, "GridExecutor", None)
    grid_call = executor.__call__ if executor is not None else None
    patch_lang = getattr(ti, "_patch_lang", None)
    builder = getattr(ti, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if (
        grid_call is None
        or get_np_dtype is None
        or patch_lang is None
        or not dataclasses.is_dataclass(options)
        or not hasattr(options, "sanitize_overflow")
        or getattr(options, "debug", True)  # with debug on, the sanitizer's asserts do fire
    ):
        return False

    # id() of each fn.__globals__ whose language modules the running launch has patched; None
    # outside a launch (every call then patches, as before).
    patched: list[set[int] | None] = [None]

    def _patch_lang_once_per_launch(fn):
        seen = patched[0]
        if seen is None:
            return patch_lang(fn)
        key = id(fn.__globals__)
        if key in seen:
            return _NO_SCOPE  # the nested callers drop the scope unrestored, as before
        scope = patch_lang(fn)
        seen.add(key)
        return scope

    def _launch(self, *args, **kwargs):
        outer, patched[0] = patched[0], set()
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched[0] = outer

    block_type, pointer_type = ti.tl.block_type, ti.tl.pointer_type
    np_dtypes: dict = {}

    def _get_np_dtype_by_scalar(tt_dtype):
        # A block's answer is its element type's (pointers: uint64 either way).
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, block_type) else tt_dtype
        if isinstance(scalar, pointer_type):  # unhashable; an address, as the original says
            return get_np_dtype(scalar)
        found = np_dtypes.get(scalar)
        if found is None:
            found = np_dtypes[scalar] = get_np_dtype(scalar)
        return found

    ti._get_np_dtype = _get_np_dtype_by_scalar
    ti._patch_lang = _patch_lang_once_per_launch
    ti.GridExecutor.__call__ = _launch
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    ti._kd_overhead_trimmed = True
    return True


class _NoScope:
    """Stands in for the scope of a skipped repeat patch: nothing to restore."""

    def restore(self) -> None:
        pass


_NO_SCOPE = _NoScope()
