"""Seeded synthetic multi-turn agentic transcripts (tools line, asks, DSML calls, results).

Every transcript is a pure function of its seed: ``make_transcript(seed)`` is replayable.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from engine.chat import ToolCall, ToolSpec, render_prompt

CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Hanoi", "Dakar", "Perth", "Riga",
          "Bern", "Accra", "Doha", "Kyiv", "Sofia", "Turin", "Porto", "Davos", "Nice", "Bonn"]
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena",
         "Mo", "Nia", "Otto", "Pia", "Raj", "Sven", "Tara", "Uma"]
ITEMS = ["lamp", "desk", "mug", "sofa", "kite", "drum", "vase", "boot", "tent", "sled", "hat",
         "pen", "cup", "rug", "fan", "bag"]
CURRENCIES = ["USD", "EUR", "JPY", "GBP", "CHF", "INR", "BRL", "CAD"]
TOPICS = ["jazz", "chess", "rust", "tides", "bees", "opera", "ramen", "yoga", "moss", "comets"]

# name -> (params with kinds, ask templates). Kinds: city/name/item/cur/topic (str), n (int).
TOOL_POOL: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "get_weather": ((("city", "city"),),
                    ("What's the weather in {city}?", "Is it cold in {city}?")),
    "get_time": ((("city", "city"),), ("What time is it in {city}?",)),
    "convert": ((("amount", "n"), ("src", "cur"), ("dst", "cur")),
                ("Convert {amount} {src} to {dst}.", "How much is {amount} {src} in {dst}?")),
    "send_email": ((("to", "name"), ("subject", "topic")),
                   ("Email {to} about {subject}.", "Send {to} a note on {subject}.")),
    "book_table": ((("city", "city"), ("people", "n")),
                   ("Book a table in {city} for {people}.",
                    "Reserve dinner for {people} in {city}.")),
    "search_web": ((("query", "topic"),), ("Search the web for {query}.", "Look up {query}.")),
    "add_todo": ((("task", "item"), ("priority", "n")),
                 ("Add a todo: buy {task}, priority {priority}.",)),
    "get_stock": ((("item", "item"),), ("How many {item} are in stock?", "Check stock of {item}.")),
    "order_item": ((("item", "item"), ("qty", "n")),
                   ("Order {qty} {item}.", "Please buy {qty} of the {item}.")),
    "call_contact": ((("name", "name"),), ("Call {name}.", "Phone {name} now.")),
    "set_timer": ((("minutes", "n"),), ("Set a timer for {minutes} minutes.",)),
    "translate": ((("text", "topic"), ("lang", "cur")), ("Translate {text} into {lang}.",)),
    "find_flight": ((("src", "city"), ("dst", "city")),
                    ("Find a flight from {src} to {dst}.", "Fly me {src} to {dst}.")),
    "get_news": ((("topic", "topic"),), ("Any news about {topic}?",)),
    "rate_movie": ((("title", "topic"), ("stars", "n")), ("Rate the film {title} {stars} stars.",)),
    "pay_bill": ((("payee", "name"), ("amount", "n")), ("Pay {payee} {amount} dollars.",)),
    "get_route": ((("city", "city"), ("stops", "n")),
                  ("Plan a route in {city} with {stops} stops.",)),
    "lookup_user": ((("name", "name"),), ("Who is {name}?", "Look up the user {name}.")),
    "play_music": ((("genre", "topic"),), ("Play some {genre}.",)),
    "ship_parcel": ((("item", "item"), ("city", "city")), ("Ship the {item} to {city}.",)),
}
KIND_TYPE = {"n": "int"}
SYSTEM_PROMPT = "You are a careful agent. Answer each ask with one tool call."
RESULTS = ["ok", "done", "sunny", "42", "7 left", "booked", "sent", "3pm", "found 2", "paid"]


def tool_spec(name: str) -> ToolSpec:
    params, _ = TOOL_POOL[name]
    return ToolSpec(name, tuple((p, KIND_TYPE.get(kind, "str")) for p, kind in params))


def sample_value(rng: random.Random, kind: str):
    pools = {"city": CITIES, "name": NAMES, "item": ITEMS, "cur": CURRENCIES, "topic": TOPICS}
    return rng.randint(1, 999) if kind == "n" else rng.choice(pools[kind])


@dataclass(frozen=True)
class Round:
    """One agentic round: the user's ask, the expected call, the tool's result, the answer."""

    ask: str
    call: ToolCall
    result: str
    answer: str


@dataclass(frozen=True)
class Transcript:
    seed: int
    tools: tuple[ToolSpec, ...]
    rounds: tuple[Round, ...]

    def messages(self, upto_round: int | None = None, with_final_call: bool = True) -> list[dict]:
        """OpenAI messages; with ``upto_round`` set, stops right after that round's user ask."""
        msgs: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
        for i, r in enumerate(self.rounds):
            msgs.append({"role": "user", "content": r.ask})
            if upto_round is not None and i == upto_round:
                return msgs
            msgs.append({"role": "assistant", "content": "", "tool_calls": [_openai_call(r.call)]})
            msgs.append({"role": "tool", "content": r.result})
            msgs.append({"role": "assistant", "content": r.answer})
        return msgs

    def text(self) -> str:
        return render_prompt(self.messages(), list(self.tools), add_generation_prompt=False)


def _openai_call(call: ToolCall) -> dict:
    return {"type": "function", "function": {"name": call.name,
                                             "arguments": json.dumps(call.arguments)}}


def make_round(rng: random.Random, name: str) -> Round:
    params, asks = TOOL_POOL[name]
    args = {p: sample_value(rng, kind) for p, kind in params}
    ask = rng.choice(asks).format(**args)
    result = json.dumps({"result": rng.choice(RESULTS)})
    answer = f"{name} says: {result}"
    return Round(ask, ToolCall(name, args), result, answer)


def make_transcript(seed: int, min_tools: int = 3, max_tools: int = 6) -> Transcript:
    rng = random.Random(seed)
    names = rng.sample(sorted(TOOL_POOL), rng.randint(min_tools, max_tools))
    rounds = tuple(make_round(rng, rng.choice(names)) for _ in range(rng.randint(1, 3)))
    return Transcript(seed, tuple(tool_spec(n) for n in names), rounds)
