"""Option values of plain types (str, int, float, bool, list[str]) converted
without pydantic.

typer 0.29 converts every option through a pydantic ``TypeAdapter``: importing
pydantic and building the adapters is ~0.1 s of each ``reorg`` command, a
quarter of what ``reorg status JOB`` may take (issue 9). For the values people
type (``7``, ``0.5``, ``public.items``) the answer is plain Python; anything
else (an enum, a bool from an environment variable, ``1e3``, a value out of
an option's range) goes to typer's own conversion, built only then, so every
error message stays typer's. ``install`` is a no-op on a typer without this
machinery (the older ones convert through click, without pydantic).
tests/unit/test_cli_coercion.py checks both paths agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Values whose conversion is not in doubt: the canonical spellings.
_INT = re.compile(r"-?(0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?")


class _Defer:
    """The fast path's "not mine": typer's own conversion decides."""


DEFER = _Defer()


def _to_int(value: Any) -> Any:
    if type(value) is int:
        return value
    if isinstance(value, str) and _INT.fullmatch(value):
        return int(value)
    return DEFER


def _to_float(value: Any) -> Any:
    if type(value) is float:
        return value
    if type(value) is int or (isinstance(value, str) and _FLOAT.fullmatch(value)):
        return float(value)
    return DEFER


def _to_str(value: Any) -> Any:
    return value if isinstance(value, str) else DEFER


def _to_bool(value: Any) -> Any:
    return value if isinstance(value, bool) else DEFER


def _to_str_list(value: Any) -> Any:
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return DEFER


_CONVERTERS: dict[Any, Callable[[Any], Any]] = {
    int: _to_int, float: _to_float, str: _to_str, bool: _to_bool, list[str]: _to_str_list,
}


def plain_converter(annotation: Any, info: Any) -> Callable[[Any], Any] | None:
    """The fast conversion for an option, or None when only typer's will do
    (a custom parser, a file, a path, a clamped range, any other type)."""
    convert = _CONVERTERS.get(annotation)
    if convert is None or getattr(info, "parser", None) is not None:
        return None
    if getattr(info, "clamp", False) or _is_path(info):
        return None
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    if low is None and high is None:
        return convert

    def in_range(value: Any) -> Any:
        converted = convert(value)
        if converted is DEFER or (low is not None and converted < low) or (
                high is not None and converted > high):
            return DEFER  # typer says what the range is
        return converted

    return in_range


def _is_path(info: Any) -> bool:
    return any(getattr(info, flag, None) for flag in ("path_type", "resolve_path", "exists"))


def install() -> bool:
    """Convert plain options without pydantic from now on in this process;
    True when typer has the machinery this replaces."""
    try:
        from typer import _coercion, core
    except ImportError:
        return False
    parameter = getattr(core, "_TyperParameter", None)
    build = getattr(_coercion, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if parameter is None or build is None or base is None or not hasattr(
            parameter, "get_runtime_param"):
        return False
    if getattr(parameter.get_runtime_param, "_reorg_plain", False):
        return True
    full: Callable[[Any], Any] = build

    @dataclass(frozen=True)
    class PlainRuntimeParam(base):  # type: ignore[misc, valid-type]
        """A plain option: ``convert`` first, typer's conversion for the rest."""

        convert: Callable[[Any], Any] = field(default=_to_str)
        descriptor: Any = None
        _full: list[Any] = field(default_factory=list)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            converted = self.convert(value)
            if converted is not DEFER:
                return converted
            if not self._full:
                self._full.append(full(self.descriptor))
            return self._full[0]._coerce_value(value, param, ctx)

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            d = self.type_descriptor
            convert = (plain_converter(d.annotation, d.parameter_info)
                       if d.file_annotation is None else None)
            self._runtime_param = (
                full(d) if convert is None else PlainRuntimeParam(
                    parameter_info=d.parameter_info, annotation=d.annotation,
                    convert=convert, descriptor=d))
        return self._runtime_param

    get_runtime_param._reorg_plain = True  # type: ignore[attr-defined]
    parameter.get_runtime_param = get_runtime_param
    return True
