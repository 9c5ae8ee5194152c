"""The official OpenAI Python client against `specdec serve` (tiny model).

Run by cli/tests/serve.rs with the URL of a server started with
`--api-key sesame`. Uses only the client's public API; the extension fields
go through `extra_body`, as a user would send them.
"""
import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=base, api_key="sesame", max_retries=0, timeout=30)

models = client.models.list()
model = models.data[0].id
assert model == "tiny:tiny-v12-l2", model

# Completions on token ids, greedy, with ids back; speculation on and off agree.
on = client.completions.create(model=model, prompt=[1, 2, 3, 1, 2, 3, 1, 2], max_tokens=12, temperature=0,
                               extra_body={"return_token_ids": True})
off = client.completions.create(model=model, prompt=[1, 2, 3, 1, 2, 3, 1, 2], max_tokens=12, temperature=0,
                                extra_body={"return_token_ids": True, "speculation": False})
assert on.choices[0].model_extra["token_ids"] == off.choices[0].model_extra["token_ids"], (on, off)
assert len(on.choices[0].model_extra["token_ids"]) == 12 and on.usage.completion_tokens == 12
assert on.choices[0].finish_reason == "length"

# Text prompts, seeded sampling: the same seed gives the same text.
a = client.completions.create(model=model, prompt="BbCcDd", max_tokens=6, temperature=0.8, seed=5)
b = client.completions.create(model=model, prompt="BbCcDd", max_tokens=6, temperature=0.8, seed=5)
assert a.choices[0].text == b.choices[0].text and len(a.choices[0].text) == 12, (a, b)

# Streaming: the chunks add up to the whole answer.
whole = client.completions.create(model=model, prompt="BbCcBbCc", max_tokens=8, temperature=0)
text = "".join(c.choices[0].text for c in client.completions.create(model=model, prompt="BbCcBbCc", max_tokens=8,
                                                                    temperature=0, stream=True) if c.choices)
assert text == whole.choices[0].text, (text, whole)

# Chat, whole and streamed, with a stop string.
chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "BbCcBbCc"}], max_tokens=8,
                                      temperature=0)
assert chat.choices[0].message.role == "assistant" and len(chat.choices[0].message.content) == 16, chat
streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "BbCcBbCc"}], max_tokens=8, temperature=0, stream=True)
    if c.choices)
assert streamed == chat.choices[0].message.content, (streamed, chat)

# Errors come back as the client's typed exceptions.
try:
    client.completions.create(model=model, prompt=[1], max_tokens=0)
    raise SystemExit("max_tokens 0 was accepted")
except openai.BadRequestError as e:
    assert "max_tokens" in str(e), e
try:
    client.completions.create(model="gpt-4", prompt=[1])
    raise SystemExit("an unknown model was accepted")
except openai.NotFoundError:
    pass
try:
    openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    raise SystemExit("a wrong key was accepted")
except openai.AuthenticationError:
    pass

print("openai client: ok")
