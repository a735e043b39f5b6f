"""Command-line values converted without pydantic when that is plain.

typer converts every option and argument through a pydantic ``TypeAdapter`` built on
first use, and importing pydantic and building the adapters costs a command more than
everything else it does at start (docs/operations.md, "A fast CLI"). Most values are
plain: a text for a ``str``, digits for an ``int``, a decimal for a ``float``. Those are
converted here, to exactly what typer's adapter makes of them; every other value (a
sign, an exponent, a value out of the option's range, a list, a path) goes to typer's own
conversion, so its results and its error messages stay typer's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from typer._click import Context
from typer._coercion import RuntimeParam, build_runtime_param
from typer.core import TyperArgument, TyperOption

if TYPE_CHECKING:
    from typer._click import Command
    from typer.core import _TyperParameter

_DIGITS = re.compile(r"[0-9]{1,15}")
_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?")


@dataclass(frozen=True)
class PlainParam(RuntimeParam):
    """A parameter's conversion: plain values here, the others by typer's own."""

    _typers: list[RuntimeParam] = field(default_factory=list, compare=False, repr=False)
    """typer's conversion (pydantic's adapter), once a value that is not plain needed it."""

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        plain = self._plain(value)
        if plain is None:
            if not self._typers:
                self._typers.append(build_runtime_param(param.type_descriptor))
            return self._typers[0]._coerce_value(value, param=param, ctx=ctx)
        return plain

    def _plain(self, value: Any) -> Any:
        """``value`` converted, or None when it is not plain."""
        kind = self.annotation
        if kind is str:
            # a lone surrogate (undecodable bytes in argv) is left to pydantic to refuse
            return value if type(value) is str and _encodable(value) else None
        if kind is int or kind is float:
            if type(value) is str:
                if not (_DIGITS if kind is int else _DECIMAL).fullmatch(value):
                    return None
            elif type(value) is not int and type(value) is not float:
                return None
            if kind is int and type(value) is float:
                return None
            number = kind(value)
            info = self.parameter_info
            if info.clamp or (info.min is not None and number < info.min):
                return None
            if info.max is not None and number > info.max:
                return None
            return number
        if kind is bool:
            return value if type(value) is bool else None
        return None


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


_PLAIN_KINDS = (str, int, float, bool)


def convert_plainly(command: Command) -> None:
    """Have ``command`` and its subcommands convert plain values without pydantic."""
    stack = [command]
    while stack:
        current = stack.pop()
        stack.extend(getattr(current, "commands", {}).values())
        convert_own_plainly(current)


def convert_own_plainly(command: Command) -> None:
    """Have ``command``'s own parameters convert plain values without pydantic."""
    # get_params: the parameters and the --help option, which is made (and kept) then
    for param in command.get_params(Context(command, **(command.context_settings or {}))):
        if not isinstance(param, TyperOption | TyperArgument):
            continue
        descriptor = param.type_descriptor
        plain = (
            descriptor.annotation in _PLAIN_KINDS
            and descriptor.parameter_info.parser is None
            and descriptor.file_annotation is None
            and not param.multiple
            and param.nargs == 1
        )
        if plain:
            param._runtime_param = PlainParam(
                parameter_info=descriptor.parameter_info, annotation=descriptor.annotation
            )
