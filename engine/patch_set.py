"""The patches a launch enabled: ``PatchSet`` validates names against ``engine.patches.PATCHES``
and describes every variant for ``/debug/patches``."""

from __future__ import annotations

from dataclasses import dataclass

from engine.patches import PATCHES


@dataclass(frozen=True)
class PatchSet:
    """A validated set of enabled patch names; ``"name" in patches`` tests one."""

    enabled: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in self.enabled:
            PATCHES.get(name)

    @classmethod
    def parse(cls, spec: str | list[str] | tuple[str, ...] | frozenset[str] | None) -> PatchSet:
        if not spec:
            return cls()
        names = spec.split(",") if isinstance(spec, str) else list(spec)
        return cls(frozenset(n.strip() for n in names if n.strip()))

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            PATCHES.get(name)
        return name in self.enabled

    def describe(self) -> list[dict]:
        return [{"name": n, "enabled": n in self.enabled, "description": PATCHES.get(n).description,
                 "bug_class": PATCHES.get(n).bug_class, "mirrors": PATCHES.get(n).mirrors,
                 "modifier": PATCHES.get(n).modifier,
                 "components": sorted(c.value for c in PATCHES.get(n).components),
                 "sim": PATCHES.get(n).sim.value} for n in PATCHES.names()]
