"""`kernels/interpreter_overhead.py`'s guards: the trims change nothing outside the interpreter,
nor where the interpreter's internals are not the shape they expect, and the block types built
once per shape are the original's, attribute for attribute, rejections included. (That they are
applied in the child processes is asserted where those run: the harness's
`settings.interpreter_trims` in tests/test_bench_harness.py and tests/test_bench.py, the decode
service's server info in tests/test_sandbox_service.py; that they leave the outputs
bit-identical is docs/benchmarks.md.)"""

from __future__ import annotations

import pytest

from . import conftest as kconf

if kconf.ON_GPU or not kconf.KERNELS_RUNNABLE:
    # Before the import below: a GPU host that runs tests/kernels from a plain copy of the
    # checkout has no kerneldev installed (its collection failed there, run G3).
    pytest.skip("needs Triton's interpreter in this process", allow_module_level=True)

from kerneldev.kernels import interpreter_overhead  # noqa: E402


def test_nothing_happens_without_triton_interpret(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    assert interpreter_overhead.trim_interpreter_overhead() is False


def test_an_interpreter_of_another_shape_is_left_as_it_is(monkeypatch):
    from triton.runtime import interpreter as ti

    assert ti._kd_overhead_trimmed is True  # this process's conftest applied them
    # As if it were a triton whose interpreter has no `_get_np_dtype`, not yet trimmed.
    monkeypatch.delattr(ti, "_kd_overhead_trimmed")
    monkeypatch.delattr(ti, "_get_np_dtype")
    block_init = ti.tl.core.block_type.__init__
    before = (ti._patch_lang, ti.GridExecutor.__call__, ti.interpreter_builder.options, block_init)
    assert interpreter_overhead.trim_interpreter_overhead() is False
    after = (
        ti._patch_lang,
        ti.GridExecutor.__call__,
        ti.interpreter_builder.options,
        ti.tl.core.block_type.__init__,
    )
    assert all(a is b for a, b in zip(after, before, strict=True))
    assert not hasattr(ti, "_kd_overhead_trimmed")


def _block_attrs(block):
    return (
        block.element_ty,
        type(block.shape),
        list(block.shape.values),
        block.shape.type,
        block.numel,
        block.name,
    )


def test_block_types_once_per_shape_are_the_originals():
    from triton.language import core

    trimmed = core.block_type.__init__
    original = trimmed.__wrapped__  # this process's conftest applied the trim
    for element in (core.float32, core.int1, core.pointer_type(core.bfloat16)):
        for shape in ([16, 64], [16, 64], core.tuple([1, 16, 512]), [1, 16, 512], [4]):
            mine, theirs = (
                core.block_type.__new__(core.block_type),
                core.block_type.__new__(core.block_type),
            )
            trimmed(mine, element, shape)
            original(theirs, element, shape)
            assert _block_attrs(mine) == _block_attrs(theirs)
            assert vars(mine).keys() == vars(theirs).keys()
            assert mine.shape is not theirs.shape  # each type its own tl.tuple, as before
    # Shapes the original rejects are rejected alike, seen before or not; constexpr dims too.
    for shape in ([3, 4], [3, 4], [0], [2**30, 2**30]):
        with pytest.raises(ValueError):
            core.block_type(core.float32, shape)
    with pytest.raises(AssertionError):
        core.block_type(core.float32, (16, 64))  # a builtin tuple: the original's assert
    with pytest.raises(TypeError):
        core.block_type(core.float32, [])
    assert core.block_type(core.float32, [core.constexpr(8), 2]).numel == 16


def test_a_block_type_of_another_shape_is_left_as_it_is():
    import types

    from triton.language import core

    class Extra(core.block_type):  # sets one more attribute than the trim knows of
        def __init__(self, element_ty, shape):
            super().__init__(element_ty, shape)
            self.extra = True

    fake = types.SimpleNamespace(block_type=Extra, tuple=core.tuple, float32=core.float32)
    assert interpreter_overhead._block_type_init_once_per_shape(fake) is None
    fake = types.SimpleNamespace(block_type=core.block_type, tuple=list, float32=core.float32)
    assert interpreter_overhead._block_type_init_once_per_shape(fake) is None
