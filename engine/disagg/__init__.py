"""PD disaggregation: prefill and decode engines, their servers and the bootstrap control plane."""

from engine.disagg.decode import DecodeEngine
from engine.disagg.prefill import PrefillEngine
from engine.disagg.state import RoomState

__all__ = ["DecodeEngine", "PrefillEngine", "RoomState"]
