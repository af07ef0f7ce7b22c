"""The official `openai` package (scripts/requirements-test.txt) against a running
native engine: chat, streaming chat, completions, streamed completions and the error
cases the SDK maps to its exception types. Prints one JSON object of findings; the Rust
test (tests/e2e/native.rs) asserts on it. Usage: openai_client.py BASE_URL MODEL API_KEY
"""

import json
import sys

import openai

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
out = {"openai_version": openai.__version__}

question = [{"role": "user", "content": "What is the capital of France?"}]
chat = client.chat.completions.create(model=model, messages=question, max_tokens=24, temperature=0)
out["chat"] = {
    "content": chat.choices[0].message.content,
    "finish_reason": chat.choices[0].finish_reason,
    "usage": chat.usage.model_dump(),
    "object": chat.object,
}

pieces, finish, usage, roles = [], None, None, []
stream = client.chat.completions.create(
    model=model, messages=question, max_tokens=24, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
out["stream"] = {"content": "".join(pieces), "finish_reason": finish, "usage": usage, "roles": roles,
                 "chunks": len(pieces)}

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                                       temperature=0, logprobs=2)
out["completion"] = {
    "text": completion.choices[0].text,
    "finish_reason": completion.choices[0].finish_reason,
    "tokens": len(completion.choices[0].logprobs.tokens),
    "usage": completion.usage.model_dump(),
}
streamed = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                                     temperature=0, stream=True)
out["completion_stream"] = "".join(c.choices[0].text for c in streamed if c.choices)

errors = {}
try:
    client.chat.completions.create(model="no-such-model", messages=question, max_tokens=4)
except openai.NotFoundError as e:
    errors["unknown_model"] = [e.status_code, e.message]
try:
    client.chat.completions.create(model=model, messages=question, max_tokens=4, temperature=-1)
except openai.BadRequestError as e:
    errors["bad_temperature"] = [e.status_code, e.message]
try:
    client.completions.create(model=model, prompt="word " * 600, max_tokens=4)
except openai.BadRequestError as e:
    errors["too_long"] = [e.status_code, e.message]
try:
    openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
except openai.AuthenticationError as e:
    errors["bad_key"] = [e.status_code, e.message]
out["errors"] = errors
out["models"] = [m.id for m in client.models.list().data]
print(json.dumps(out))
