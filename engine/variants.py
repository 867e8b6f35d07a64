"""The seam bug variants plug into: each component that has variants defines a hooks class whose
methods are the correct behaviour at documented points; a variant is a mixin that overrides one
of them, registered under its patch name (``engine.patches.variant``: the record's
``behaviour``). ``hooks_for`` composes the
enabled mixins over the base class once, at construction, so the engine's code calls a hook and
never asks which variant is on.

Invariant: with no patch enabled, ``hooks_for(base, ())`` is ``base()``; mixins of one base
override disjoint methods, so any combination composes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from engine.patches import _MIXINS, variant

__all__ = ["hooks_for", "variant", "variant_names"]

T = TypeVar("T")


def hooks_for(base: type[T], patches: Iterable[str]) -> T:
    """An instance of ``base`` with the mixins of every enabled patch that extend it."""
    mixins = [m for p in sorted(patches) for m in _MIXINS.get(p, ()) if issubclass(m, base)]
    if not mixins:
        return base()
    return type(f"{base.__name__}[{'+'.join(m.__name__ for m in mixins)}]",
                (*mixins, base), {})()


def variant_names() -> set[str]:
    """Patch names with at least one mixin registered so far (the rest act through
    configuration)."""
    return set(_MIXINS)
