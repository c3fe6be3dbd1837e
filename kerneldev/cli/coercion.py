"""typer's value coercion without pydantic where its answer is known in advance.

typer 0.29 coerces every parameter's value through a pydantic `TypeAdapter` that it builds at
parse time, one per parameter of the command being run (`--help` and `--config` included),
even when the value is None or already a `str`: importing pydantic and building the adapters
is about 0.2-0.3 CPU-s of every command's ~0.65 (docs/benchmarks.md, the CLI's start-up).

For the plain cases below the adapter's result is fixed by typer's own rules, so it is given
without building one: None for any parameter (typer returns None, or () for a multi-value
parameter, before it looks at the adapter), a `str` for a `str` parameter (`str(value)`), a
tuple of `str` for a `list[str]` one (a list of them), an `int` / `float` of exactly that type
or plainly spelled (`3`, `2.5`) within the parameter's min/max (the number). Everything else,
every error included, goes to typer's own adapter, built as typer builds it: messages and
results are typer's. Applied only when typer's internals have the shape this was written
against; otherwise nothing changes.
"""

from __future__ import annotations

import re
from typing import Any

_PLAIN = (str, int, float, bool)
# Numbers as a command line spells them most often, which int() / float() read exactly as
# pydantic's lax mode does; any other spelling (signs, spaces, exponents, `_`) goes to pydantic.
_INT = re.compile(r"(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,15})?")


def _plain_value(descriptor: Any, multi: bool, value: Any) -> tuple[bool, Any]:
    """(True, the coerced value) where typer's answer is known without pydantic, else
    (False, None)."""
    if value is None:
        return True, (() if multi else None)
    if not _simple(descriptor):
        return False, None
    annotation = descriptor.annotation
    if annotation is str:
        return (True, value) if type(value) is str and not multi else (False, None)
    if annotation == list[str]:
        if multi and type(value) in (list, tuple) and all(type(v) is str for v in value):
            return True, list(value)
        return False, None
    if annotation in (int, float) and not multi:
        if type(value) is str and (_INT if annotation is int else _FLOAT).fullmatch(value):
            value = annotation(value)
        if type(value) is annotation:
            info = descriptor.parameter_info
            low, high = getattr(info, "min", None), getattr(info, "max", None)
            if (low is None or value >= low) and (high is None or value <= high):
                return True, value
    return False, None


def _simple(descriptor: Any) -> bool:
    info = descriptor.parameter_info
    annotation = descriptor.annotation
    return (
        (annotation in _PLAIN or annotation == list[str])
        and descriptor.file_annotation is None
        and not descriptor.is_choice
        and getattr(info, "parser", None) is None
        and not getattr(info, "clamp", False)
    )


class _Plain:
    """The runtime parameter of a plain one: the known cases here, the rest to typer's."""

    def __init__(self, build) -> None:
        self._build = build

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        known, result = _plain_value(
            param.type_descriptor, bool(param.multiple or param.nargs == -1), value
        )
        if known:
            return result
        return self._build(param).coerce(value, param=param, ctx=ctx)


def build_all(param: Any) -> None:
    """Build `param`'s runtime parameter (pydantic's adapter) now, as typer itself would on
    first use: the warm process does it once, before it forks the commands it serves."""
    method = getattr(param, "get_runtime_param", None)
    if method is None:
        return
    typer_build = getattr(getattr(method, "__func__", None), "typer_build", None)
    if typer_build is not None:
        typer_build(param)
    else:
        method()


def install() -> bool:
    """Route typer's coercion of plain values around pydantic; False (and nothing changed)
    where typer's internals are not the expected ones."""
    try:
        from typer import _coercion
        from typer.core import _TyperParameter
    except ImportError:
        return False
    build = getattr(_TyperParameter, "get_runtime_param", None)
    if build is None or getattr(build, "_kerneldev_plain", False):
        return build is not None
    coerce = getattr(getattr(_coercion, "RuntimeParam", None), "coerce", None)
    if coerce is None or not callable(getattr(_TyperParameter, "process_value", None)):
        return False
    # None is answered as RuntimeParam.coerce answers it, for every kind: no kind may differ.
    kinds = ("AdapterRuntimeParam", "FileRuntimeParam", "PassThroughRuntimeParam")
    if any(getattr(getattr(_coercion, k, None), "coerce", None) is not coerce for k in kinds):
        return False

    def get_runtime_param(self):
        if self._runtime_param is None and getattr(self, "type_descriptor", None) is not None:
            return _Plain(build)
        return build(self)

    get_runtime_param._kerneldev_plain = True  # type: ignore[attr-defined]
    get_runtime_param.typer_build = build  # type: ignore[attr-defined]
    _TyperParameter.get_runtime_param = get_runtime_param  # type: ignore[method-assign]
    return True
