"""The official OpenAI Python client against `specdec serve` on SmolLM2 with
structured outputs (CONSTRAIN-1 .. CONSTRAIN-5): `response_format` of type
`json_schema` on a tool-call prompt mix, then `json_object`. Every answer is
valid JSON under the schema (a JSON object), greedy answers are the same
tokens with speculation on and off,
and the time of each is printed (the speedup, stated, never asserted).

Run by cli/tests/serve.rs with the URL of a server of SmolLM2 with n-gram
speculation. Uses only the client's public API; the prompts and the schema are
`fixtures/prompts/tool_calls.json`.
"""
import json
import pathlib
import sys
import time

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=300)
model = client.models.list().data[0].id

mix = json.load(open(pathlib.Path(__file__).parents[2] / "fixtures" / "prompts" / "tool_calls.json"))
schema = mix["schema"]
prompts = [p["text"] for p in mix["prompts"]]


def valid(v):
    """The schema, checked by hand: the keys in order, their types, nothing else."""
    assert list(v) == ["name", "arguments"] and v["name"] in schema["properties"]["name"]["enum"], v
    a = v["arguments"]
    assert list(a)[0] == "query" and isinstance(a["query"], str) and len(a["query"]) <= 40, v
    assert set(a) <= {"query", "days", "urgent"}, v
    assert isinstance(a.get("days", 0), int) and isinstance(a.get("urgent", False), bool), v


seconds = {True: 0.0, False: 0.0}
tokens = 0
for prompt in prompts:
    answers = {}
    for speculation in (True, False):
        start = time.perf_counter()
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=96,
            response_format={"type": "json_schema", "json_schema": {"name": "tool_call", "schema": schema, "strict": True}},
            extra_body={"speculation": speculation, "return_token_ids": True})
        seconds[speculation] += time.perf_counter() - start
        answers[speculation] = r.choices[0]
    on, off = answers[True], answers[False]
    assert on.model_extra["token_ids"] == off.model_extra["token_ids"], (on, off)
    assert on.finish_reason == "stop", on
    valid(json.loads(on.message.content))
    tokens += len(on.model_extra["token_ids"])
    print(on.message.content)
print(f"{len(prompts)} prompts, {tokens} tokens: speculation on {seconds[True]:.2f} s, off {seconds[False]:.2f} s, "
      f"speedup {seconds[False] / seconds[True]:.2f}x")

# `json_object`: any JSON object (CONSTRAIN-5's free-form object); an answer
# that ends at eos parses as a JSON object, and at least one does.
objects = 0
for prompt in ["Describe a cat as a JSON object with its name and age.", "Give the weather in Paris as JSON."]:
    answers = {}
    for speculation in (True, False):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=64,
            response_format={"type": "json_object"}, extra_body={"speculation": speculation, "return_token_ids": True})
        answers[speculation] = r.choices[0]
    on, off = answers[True], answers[False]
    assert on.model_extra["token_ids"] == off.model_extra["token_ids"], (on, off)
    if on.finish_reason == "stop":
        assert isinstance(json.loads(on.message.content), dict), on
        objects += 1
    print(on.finish_reason, on.message.content)
assert objects >= 1, "no json_object answer ended"
print("structured outputs: ok")
