"""Seeded agentic transcripts, training and tool-call evaluation of the shipped model."""

from engine.training.datagen import make_transcript

__all__ = ["make_transcript"]
