"""The PD router: ``python -m engine.router --prefill URL --decode URL --seed S``."""

from engine.router.app import create_app
from engine.router.state import RouterConfig

__all__ = ["RouterConfig", "create_app"]
