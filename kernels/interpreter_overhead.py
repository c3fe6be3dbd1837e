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
* Every `tl.block_type(element, shape)` (one per block operation, ~70,000 in the h128 SIMT case:
  the interpreter's `to_ir` rebuilds each block type it is handed, and every cast, broadcast and
  expand_dims makes one) re-normalises its shape through `_unwrap_shape` (building throwaway
  `tl.tuple`s), re-validates it with `validate_block_shape` and re-formats it for `name`
  (~20% of a launch). All three depend only on the shape: for a shape of plain ints they are
  computed once per shape; each type still gets its own `tl.tuple` of the same values, and the
  first construction of a shape (or any shape with constexprs, or one that fails validation)
  runs the original code.

All are applied only when the interpreter is in use (TRITON_INTERPRET=1) and its internals have
the shape described above (checked here); otherwise nothing changes and the run is just slower
(a `block_type` of another shape alone is left as it is, the other three trims still apply).
Compiled kernels on a GPU never go through this module, and its callers call it only on their
CPU path: the sandbox decode service on CPU (`kerneldev/sandbox/service/engine.py`), the
harness's `--cpu-mode` (`dsv4_bench.py`, which this file travels with to the host: it needs
only the standard library and triton) and the kernel tests without a GPU
(`tests/kernels/conftest.py`). The outputs are bit-identical with and without the trims
(docs/benchmarks.md, "The interpreter trims in the child processes"; the block types: "A second
round of interpreter trims").
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

    # None where block_type is not the shape expected: the other trims still apply.
    block_init = _block_type_init_once_per_shape(ti.tl.core)

    ti._get_np_dtype = _get_np_dtype_by_scalar
    ti._patch_lang = _patch_lang_once_per_launch
    ti.GridExecutor.__call__ = _launch
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    if block_init is not None:
        ti.tl.core.block_type.__init__ = block_init
    ti._kd_overhead_trimmed = True
    return True


def _block_type_init_once_per_shape(core):
    """A `block_type.__init__` that does the shape's work once per shape of plain ints; None if
    `block_type` is not the shape expected (its four attributes, its shape a `tl.tuple`)."""
    block_type, tl_tuple = getattr(core, "block_type", None), getattr(core, "tuple", None)
    if not isinstance(block_type, type) or not isinstance(tl_tuple, type):
        return None
    original = block_type.__init__
    try:
        probe = block_type.__new__(block_type)
        original(probe, core.float32, [2, 4])
    except Exception:
        return None
    if (
        set(vars(probe)) != {"element_ty", "shape", "numel", "name"}
        or type(probe.shape) is not tl_tuple
        or list(probe.shape.values) != [2, 4]
        or probe.numel != 8
        or probe.name != f"<{probe.shape}, {core.float32}>"
    ):
        return None

    # the dims (a builtin tuple of ints) -> (its values, the tl.tuple's type, numel, str of shape)
    shapes: dict = {}

    def __init__(self, element_ty, shape):
        # A list or a tl.tuple (the original asserts one of them: a builtin tuple fails there).
        kind = type(shape)
        dims = shape if kind is list else shape.values if kind is tl_tuple else None
        if dims is not None:
            for dim in dims:
                if type(dim) is not int:  # constexprs, bools: the original path
                    break
            else:
                key = tuple(dims)
                found = shapes.get(key)
                if found is not None:
                    values, tuple_ty, numel, shape_str = found
                    self.element_ty = element_ty
                    self.shape = tl_tuple(values, tuple_ty)  # its own tuple, as before
                    self.numel = numel
                    self.name = f"<{shape_str}, {element_ty}>"
                    return
                original(self, element_ty, shape)  # raises for a shape the original rejects
                shapes[key] = (
                    list(self.shape.values),
                    self.shape.type,
                    self.numel,
                    f"{self.shape}",
                )
                return
        original(self, element_ty, shape)

    __init__.__wrapped__ = original
    return __init__


class _NoScope:
    """Stands in for the scope of a skipped repeat patch: nothing to restore."""

    def restore(self) -> None:
        pass


_NO_SCOPE = _NoScope()
