"""The engine loop: ``Scheduler.schedule() -> Batch``, ``ModelRunner.run(batch) -> StepOutput``,
one ``Engine`` driving them (normal or overlap step), and buffer dumps."""

from engine.core.engine import Engine, PromptTooLongError
from engine.core.sequence import FinishReason, SamplingParams, Sequence, TokenEvent

__all__ = ["Engine", "FinishReason", "PromptTooLongError", "SamplingParams", "Sequence",
           "TokenEvent"]
