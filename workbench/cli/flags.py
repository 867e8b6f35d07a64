"""``wb`` flags generated from a run's frozen spec: one flag per field, named after it
(``runs_dir`` -> ``--runs-dir``), with the field's default and ``metadata["help"]``; the parsed
flags rebuild the spec (``spec_from_args``). No flag of a spec is spelled anywhere else.

Types: ``bool`` fields default True become ``--no-NAME``; ``tuple[str, ...]`` fields take a
comma-separated list (``''``: empty; absent: the field's default, which may be None); ``judge``
takes a count or ``all`` (None); other fields parse with their type.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any


def judge_arg(text: str) -> int | None:
    """``--judge``: rooms per burst for the buffer oracle, a count >= 0 or ``all`` (None)."""
    if text != "all" and not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"--judge wants a count >= 0 or 'all', not {text!r}")
    return None if text == "all" else int(text)


def names_arg(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (``''``: none)."""
    return tuple(n for n in text.split(",") if n)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parser_of(name: str, hint: Any):
    if name == "judge":
        return judge_arg
    if typing.get_origin(hint) is tuple:
        return names_arg
    base = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    kind = typing.get_origin(base[0]) or base[0]
    return names_arg if kind is tuple else kind


def add_spec_flags(p: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                   aliases: dict[str, str] | None = None, absent_unless_given: bool = False,
                   notes: dict[str, str] | None = None) -> None:
    """One flag per field of the dataclass ``cls`` (except ``skip``). ``aliases``: a second
    flag name per field; ``absent_unless_given``: a flag left out sets nothing (the spec's own
    default applies when ``spec_from_args`` builds it, and another command sharing the flag
    keeps its function's); ``notes``: text appended to a field's help."""
    hints, aliases, notes = typing.get_type_hints(cls), aliases or {}, notes or {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        help_ = f.metadata.get("help", "") + notes.get(f.name, "")
        names = [flag(f.name), *([flag(aliases[f.name])] if f.name in aliases else [])]
        default = argparse.SUPPRESS if absent_unless_given else f.default
        if hints[f.name] is bool:
            p.add_argument(flag(f"no_{f.name}" if f.default else f.name), dest=f.name,
                           action="store_false" if f.default else "store_true",
                           default=default, help=f"leave out: {help_}" if f.default else help_)
            continue
        shown = f" (default: {f.default})" if f.default not in (None, (), "") else ""
        p.add_argument(*names, dest=f.name, type=_parser_of(f.name, hints[f.name]),
                       default=default, help=help_ + shown)


def spec_from_args(cls: type, args: argparse.Namespace, **extra: Any):
    """The spec the parsed flags describe; a spec that refuses its values ends the command with
    its message."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if hasattr(args, f.name)}
    try:
        return cls(**{**values, **extra})
    except ValueError as exc:
        raise SystemExit(f"wb {args.cmd}: {exc}") from None


def defaults_of(*fns: Callable, name: str) -> str:
    """``help`` text naming the library's default of parameter ``name`` in each of ``fns``
    (a flag left out passes nothing, so the function's own default applies: never respelled)."""
    shown = [f"{fn.__name__}: {inspect.signature(fn).parameters[name].default!r}" for fn in fns
             if name in inspect.signature(fn).parameters]
    return "default: the library's (" + "; ".join(shown) + ")"


def given(args: argparse.Namespace, fn: Callable, names: tuple[str, ...]) -> dict[str, Any]:
    """The flags among ``names`` that were given (not None) and that ``fn`` takes, as its
    keyword arguments."""
    params = inspect.signature(fn).parameters
    return {n: getattr(args, n) for n in names
            if n in params and getattr(args, n, None) is not None}
