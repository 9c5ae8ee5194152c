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

# Logprobs (LOGPROB-3, LOGPROB-4): chat and completions, speculation on
# equal to off at temperature 0, one entry per token, streamed the same.
def chat_logprobs(speculation, stream=False, mode="raw"):
    kw = dict(model=model, messages=[{"role": "user", "content": "BbCcBbCcBbCc"}], max_tokens=10, temperature=0,
              logprobs=True, top_logprobs=3, extra_body={"speculation": speculation, "logprobs_mode": mode})
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        if speculation:
            # The comparison with speculation off is not vacuous: drafts were verified.
            drafts = choice.model_extra["draft_tokens"]
            assert drafts["proposed"] > 0 and drafts["accepted"] > 0, ("speculation drafted nothing", drafts)
        return choice.logprobs.content
    return [e for c in client.chat.completions.create(stream=True, **kw) if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content]
for mode in ["raw", "processed"]:
    on, off = chat_logprobs(True, mode=mode), chat_logprobs(False, mode=mode)
    assert len(on) == 10 and [(e.token, e.logprob) for e in on] == [(e.token, e.logprob) for e in off], (on, off)
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob for e in on), on
    assert all(e.logprob <= 0 and e.logprob == max(t.logprob for t in e.top_logprobs) for e in on), on
    assert [(e.token, e.logprob) for e in chat_logprobs(True, stream=True, mode=mode)] == [(e.token, e.logprob) for e in on]
done = client.completions.create(model=model, prompt=[1, 2, 3, 1, 2, 3, 1, 2], max_tokens=12, temperature=0, logprobs=2,
                                 extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
lp = done.choices[0].logprobs
assert lp.tokens == ["token_id:%d" % t for t in done.choices[0].model_extra["token_ids"]], lp
assert len(lp.token_logprobs) == 12 and all(len(t) == 2 for t in lp.top_logprobs), lp
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Bb"}], logprobs=True,
                                   top_logprobs=21)
    raise SystemExit("top_logprobs 21 was accepted")
except openai.BadRequestError as e:
    assert "top_logprobs" in str(e), e

# Structured outputs (CONSTRAIN-3): a regex over tiny text, greedy, the same
# tokens with speculation on and off, the text a match ending at eos 11.
import re
pattern = "A(a[BC]|b[AC]|c[AB])*[abc]"
def constrained(speculation):
    return client.completions.create(model=model, prompt=[0, 1, 0, 1, 0, 1, 0], max_tokens=20, temperature=0,
                                     extra_body={"structured_outputs": {"regex": pattern}, "stop_token_ids": [11],
                                                 "return_token_ids": True, "speculation": speculation}).choices[0]
on, off = constrained(True), constrained(False)
assert on.model_extra["token_ids"] == off.model_extra["token_ids"], (on, off)
assert on.finish_reason == "stop" and re.fullmatch(pattern, on.text), on

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
