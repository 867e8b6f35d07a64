"""Text formats: tokenizer, chat template, DSML grammar and the tool-call parser."""

from engine.text.chat import ToolCall, ToolSpec, render_prompt
from engine.text.dsml import ParseResult, StreamingDSMLDetector, parse_tool_calls
from engine.text.tokenizer import Tokenizer
from engine.text.tool_schema import Schema

__all__ = ["ParseResult", "Schema", "StreamingDSMLDetector", "Tokenizer", "ToolCall",
           "ToolSpec", "parse_tool_calls", "render_prompt"]
