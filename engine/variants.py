"""The seam bug variants plug into: each component that has variants defines a hooks class whose
methods are the correct behaviour at documented points; a variant is a mixin that overrides one
of them, registered under its patch name (``engine.patches``). ``hooks_for`` composes the
enabled mixins over the base class once, at construction, so the engine's code calls a hook and
never asks which variant is on.

Invariant: with no patch enabled, ``hooks_for(base, ())`` is ``base()``; mixins of one base
override disjoint methods, so any combination composes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")
_VARIANTS: dict[str, list[type]] = {}


def variant(patch: str):
    """Registers the decorated mixin as (part of) patch ``patch``'s behaviour."""
    def register(mixin: type) -> type:
        _VARIANTS.setdefault(patch, []).append(mixin)
        return mixin
    return register


def hooks_for(base: type[T], patches: Iterable[str]) -> T:
    """An instance of ``base`` with the mixins of every enabled patch that extend it."""
    mixins = [m for p in sorted(patches) for m in _VARIANTS.get(p, ()) if issubclass(m, base)]
    if not mixins:
        return base()
    return type(f"{base.__name__}[{'+'.join(m.__name__ for m in mixins)}]",
                (*mixins, base), {})()


def variant_names() -> set[str]:
    """Patch names with at least one mixin (the rest act through configuration)."""
    return set(_VARIANTS)
