"""Tools as agent frameworks send them -- ``openai.pydantic_function_tool`` of pydantic models
with Optional, enum, nested-model and list fields -- against a real subprocess server of ours,
in each parser mode, through the openai SDK: the schemas are accepted, the requests served, the
calls' arguments validate against the models (one-shot and streamed alike), and a streamed
agent loop runs the tools and feeds their results back. In ``sglang`` mode the wire follows
SGLang's serving rules (a call-only message has ``content: ""``)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

import openai
import pytest
from pydantic import BaseModel, Field

from engine.training.datagen import POOL, SYSTEM_PROMPT
from workbench.deploy.process import ServerProcess, python_module

pytestmark = [pytest.mark.slow, pytest.mark.servers]


class Currency(str, enum.Enum):
    USD = "USD"
    EUR = "EUR"
    JPY = "JPY"
    GBP = "GBP"


class Guest(BaseModel):
    name: str
    phone: str | None = None


class BookTable(BaseModel):
    """Book a table."""

    city: str
    people: int | None = None
    guest: Guest | None = None
    notes: list[str] = Field(default_factory=list)


class Convert(BaseModel):
    """Convert money."""

    amount: int
    src: Currency
    dst: Currency


class Stop(BaseModel):
    city: str
    minutes: int | None = None


class GetRoute(BaseModel):
    """Plan a route."""

    city: str
    stops: int | None = None
    via: list[Stop] = Field(default_factory=list)


MODELS: dict[str, type[BaseModel]] = {"book_table": BookTable, "convert": Convert,
                                      "get_route": GetRoute}
TOOLS = [openai.pydantic_function_tool(m, name=n) for n, m in MODELS.items()]
# asks the shipped model answers with these calls (greedy decoding)
ASKS = {"Book a table in Oslo for 4.": ("book_table", {"city": "Oslo", "people": 4}),
        "How much is 55 GBP in JPY?": ("convert", {"amount": 55, "src": "GBP", "dst": "JPY"}),
        "Plan a route in Lima with 3 stops.": ("get_route", {"city": "Lima", "stops": 3})}


@dataclass(frozen=True)
class Served:
    srv: ServerProcess
    parser: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.srv.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module", params=["strict", "sglang", "vllm"])
def served(request, tmp_path_factory):
    srv = ServerProcess(f"agent-{request.param}", python_module(
        "engine", "serve", "--port", "{port}", "--set", f"tool_parser={request.param}"),
        tmp_path_factory.mktemp("logs"))
    srv.start()
    try:
        srv.wait_healthy(timeout=120)
        yield Served(srv, request.param)
    finally:
        srv.stop()


def ask(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]


def checked(name: str, arguments: str) -> BaseModel:
    """The call's arguments as its tool's model: typed as the schema says, nothing coerced."""
    return MODELS[name].model_validate_json(arguments, strict=True)


def test_pydantic_tools_are_accepted_and_called_with_typed_arguments(served):
    sdk = served.client()
    for text, (name, args) in ASKS.items():
        resp = sdk.chat.completions.create(model="m", messages=ask(text), tools=TOOLS,
                                           max_tokens=120)
        msg = resp.choices[0].message
        assert resp.choices[0].finish_reason == "tool_calls"
        (call,) = msg.tool_calls
        assert call.function.name == name and json.loads(call.function.arguments) == args
        assert checked(name, call.function.arguments) == MODELS[name](**args)
        assert msg.content == ("" if served.parser == "sglang" else None)


@dataclass
class Streamed:
    """What a client assembles from one streamed completion."""

    content: str
    calls: dict[int, dict]
    finish: str | None


def stream(sdk: openai.OpenAI, messages: list[dict]) -> Streamed:
    out = Streamed("", {}, None)
    for chunk in sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                             max_tokens=120, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        out.content += choice.delta.content or ""
        out.finish = choice.finish_reason or out.finish
        for tc in choice.delta.tool_calls or []:
            call = out.calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or tc.id
            call["name"] += tc.function.name or ""
            call["arguments"] += tc.function.arguments or ""
    return out


def run_tool(name: str, arguments: str, turn: int) -> str:
    """The tool: its arguments must validate; its result is one the model was trained on."""
    checked(name, arguments)
    return json.dumps({"result": POOL.results[turn % len(POOL.results)]})


def test_a_streamed_agent_loop_runs_the_tools_and_answers_with_their_results(served):
    sdk = served.client()
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for turn, (text, (name, args)) in enumerate(ASKS.items()):
        messages.append({"role": "user", "content": text})
        step = stream(sdk, messages)
        assert step.finish == "tool_calls" and len(step.calls) == 1, step
        call = step.calls[0]
        assert (call["name"], json.loads(call["arguments"])) == (name, args)
        result = run_tool(call["name"], call["arguments"], turn)
        messages += [{"role": "assistant", "content": step.content or None, "tool_calls": [
            {"id": call["id"], "type": "function",
             "function": {"name": call["name"], "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": result}]
        answer = stream(sdk, messages)
        assert not answer.calls and result in answer.content, answer
        messages.append({"role": "assistant", "content": answer.content})


def test_a_malformed_schema_is_a_400_naming_the_param(served):
    bad = openai.pydantic_function_tool(GetRoute, name="get_route")
    bad["function"]["parameters"]["$defs"]["Stop"]["properties"]["minutes"] = {
        "anyOf": [{"type": "int"}, {"type": "null"}]}
    with pytest.raises(openai.BadRequestError) as info:
        served.client().chat.completions.create(model="m", messages=ask("hi"), tools=[bad])
    assert info.value.body["message"].startswith(
        "tools[0].function.parameters.$defs.Stop.properties.minutes.anyOf[0].type: unknown type "
        "'int'")
    assert served.client().chat.completions.create(
        model="m", messages=ask("hi"), tools=TOOLS, max_tokens=4).choices
