"""`kernels/interpreter_overhead.py`'s guards: the trims change nothing outside the interpreter,
nor where the interpreter's internals are not the shape they expect. (That they are applied in
the child processes is asserted where those run: the harness's `settings.interpreter_trims` in
tests/test_bench_harness.py and tests/test_bench.py, the decode service's server info in
tests/test_sandbox_service.py; that they leave the outputs bit-identical is docs/benchmarks.md.)"""

from __future__ import annotations

import pytest
from kerneldev.kernels import interpreter_overhead

from . import conftest as kconf

if kconf.ON_GPU or not kconf.KERNELS_RUNNABLE:
    pytestmark = pytest.mark.skipif(True, reason="needs Triton's interpreter in this process")


def test_nothing_happens_without_triton_interpret(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    assert interpreter_overhead.trim_interpreter_overhead() is False


def test_an_interpreter_of_another_shape_is_left_as_it_is(monkeypatch):
    from triton.runtime import interpreter as ti

    assert ti._kd_overhead_trimmed is True  # this process's conftest applied them
    # As if it were a triton whose interpreter has no `_get_np_dtype`, not yet trimmed.
    monkeypatch.delattr(ti, "_kd_overhead_trimmed")
    monkeypatch.delattr(ti, "_get_np_dtype")
    before = (ti._patch_lang, ti.GridExecutor.__call__, ti.interpreter_builder.options)
    assert interpreter_overhead.trim_interpreter_overhead() is False
    after = (ti._patch_lang, ti.GridExecutor.__call__, ti.interpreter_builder.options)
    assert all(a is b for a, b in zip(after, before, strict=True))
    assert not hasattr(ti, "_kd_overhead_trimmed")
