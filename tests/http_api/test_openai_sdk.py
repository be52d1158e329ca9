"""The official openai SDK against a live strata-server (--http-listen): completions and chat, streamed and
not, logprobs, n, stop, seed, and the SDK's own exception classes, with greedy output equal to transformers'
generate() on the same checkpoint (for chat, on apply_chat_template's ids)."""

from __future__ import annotations

import json
import math
import urllib.request

import openai
import pytest

PROMPTS = ["The quick brown fox", "hello world, this is strata", "a"]
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())


def chat_ids(reference, messages) -> list[int]:
    return reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_greedy_equals_transformers(client, reference, prompt):
    ids = reference.tokenizer.encode(prompt)
    want = reference.generate(ids, 12)
    got = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=12, temperature=0)
    assert got.object == "text_completion" and got.model == "tiny-llama" and got.id.startswith("cmpl-")
    assert got.choices[0].text == want["text"]
    assert got.choices[0].finish_reason == "length"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == (len(ids), 12,
                                                                                            len(ids) + 12)


def test_completion_of_token_ids_and_lists(client, reference):
    ids = [[5, 17, 42, 99], [7, 8]]
    got = client.completions.create(model="tiny-llama", prompt=ids, max_tokens=6, temperature=0)
    assert [c.index for c in got.choices] == [0, 1]
    for choice, prompt in zip(got.choices, ids):
        assert choice.text == reference.generate(prompt, 6)["text"]
    assert got.usage.prompt_tokens == 6
    texts = client.completions.create(model="tiny-llama", prompt=PROMPTS[:2], max_tokens=4, temperature=0)
    for choice, prompt in zip(texts.choices, PROMPTS[:2]):
        assert choice.text == reference.generate(reference.tokenizer.encode(prompt), 4)["text"]


def test_completion_stream_equals_whole(client):
    whole = client.completions.create(model="tiny-llama", prompt=PROMPTS[1], max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model="tiny-llama", prompt=PROMPTS[1], max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # include_usage: the last chunk has no choices and the usage; the others carry usage null.
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_greedy_equals_transformers_on_apply_chat_template(client, reference):
    ids = chat_ids(reference, CHAT)
    want = reference.generate(ids, 10)
    got = client.chat.completions.create(model="tiny-llama", messages=CHAT, max_completion_tokens=10, temperature=0)
    assert got.object == "chat.completion" and got.id.startswith("chatcmpl-")
    assert got.choices[0].message.role == "assistant"
    # The engine's text skips special tokens (vLLM's default skip_special_tokens).
    assert got.choices[0].message.content == reference.tokenizer.decode(want["ids"], skip_special_tokens=True)
    assert got.usage.prompt_tokens == len(ids)
    # /tokenize with messages gives apply_chat_template's ids too.
    tokenized = post_json(str(client.base_url).replace("/v1/", "/tokenize"), {"messages": CHAT})
    assert tokenized["tokens"] == ids and tokenized["count"] == len(ids)


def test_chat_stream_starts_with_the_role_and_equals_whole(client):
    whole = client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=15, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=15, temperature=0,
                                                 stream=True))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_logprobs_equal_transformers(client, reference):
    ids = reference.tokenizer.encode(PROMPTS[0])
    want = reference.generate(ids, 6)
    got = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    for step, (token_id, logprob) in enumerate(zip(want["ids"], lp.token_logprobs)):
        assert math.isclose(logprob, want["logprobs"][step][token_id].item(), abs_tol=1e-4)
        # Greedy: the sampled token is the most likely of the listed ones (3 best, and the sampled).
        top = lp.top_logprobs[step]
        assert 3 <= len(top) <= 4 and max(top, key=top.get) == lp.tokens[step]
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_chat_logprobs_equal_transformers(client, reference):
    want = reference.generate(chat_ids(reference, CHAT), 5)
    got = client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=5, temperature=0,
                                         logprobs=True, top_logprobs=2)
    content = got.choices[0].logprobs.content
    assert len(content) == 5
    for step, entry in enumerate(content):
        assert math.isclose(entry.logprob, want["logprobs"][step][want["ids"][step]].item(), abs_tol=1e-4)
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.bytes == list(entry.token.encode())


def test_n_and_seed_are_reproducible(client):
    def run():
        got = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=12, temperature=1.0, n=4,
                                        seed=1234)
        return [c.text for c in sorted(got.choices, key=lambda c: c.index)]

    first = run()
    assert len(first) == 4
    assert run() == first  # seeded: the same whatever else runs
    assert len(set(first)) > 1  # the n samples differ from each other


def test_stop_string_ends_before_it(client):
    whole = client.completions.create(model="tiny-llama", prompt=PROMPTS[1], max_tokens=30, temperature=0)
    text = whole.choices[0].text
    stop = text[8:10]
    assert stop and stop in text
    got = client.completions.create(model="tiny-llama", prompt=PROMPTS[1], max_tokens=30, temperature=0, stop=[stop])
    assert got.choices[0].finish_reason == "stop"
    assert got.choices[0].text == text[:text.index(stop)]


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]
    assert models.data[0].owned_by == "strata"


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"logprobs": 21}, "logprobs"),
    ({"stop": ["a"] * 17}, "stop"),
    ({"max_tokens": 511}, "prompt"),  # 2 prompt tokens + 511 > --max-context 512
])
def test_bad_request_names_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny-llama", prompt="hi", **fields)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}")


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=1)
    assert caught.value.body["code"] == "model_not_found" and "tiny-llama" in caught.value.body["message"]


def test_bad_chat_messages_name_the_message(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}], max_tokens=1)
    assert caught.value.body["param"] == "messages[0].content[0].type"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny-llama", messages=[], max_tokens=1)
    assert caught.value.body["param"] == "messages"


def test_wrong_key_is_an_authentication_error(server_factory, chat_model, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("strata-test-key-0123456789abcdef\n")
    server = server_factory(["--model", str(chat_model), "--served-model-name", "tiny-llama",
                             "--api-key-file", str(keys)])
    wrong = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="not-the-key-0123456789", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.completions.create(model="tiny-llama", prompt="hi", max_tokens=1)
    assert caught.value.status_code == 401
    right = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="strata-test-key-0123456789abcdef", max_retries=0)
    assert right.completions.create(model="tiny-llama", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert urllib.request.urlopen(f"{server.http_url}/health").status == 200  # open: probes send no key


def test_over_max_streams_is_a_rate_limit_error(server_factory, chat_model):
    server = server_factory(["--model", str(chat_model), "--served-model-name", "tiny-llama", "--max-streams", "1",
                             "--max-context", "2048", "--max-new-tokens", "2000"])
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="x", max_retries=0)
    stream = client.completions.create(model="tiny-llama", prompt="a", max_tokens=2000, stream=True,
                                       temperature=0, extra_body={"ignore_eos": True})
    first = next(iter(stream))  # the long generation is running
    assert first.choices
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            client.completions.create(model="tiny-llama", prompt="b", max_tokens=1)
        assert "--max-streams" in caught.value.body["message"]
    finally:
        stream.close()


def test_echo_with_logprobs_scores_the_prompt_as_transformers(client, reference):
    import torch
    ids = reference.tokenizer.encode(PROMPTS[1])
    with torch.no_grad():
        logits = reference.model(torch.tensor([ids])).logits[0].double()
    want = torch.log_softmax(logits, -1)
    for max_tokens in (0, 1):
        got = client.completions.create(model="tiny-llama", prompt=ids, max_tokens=max_tokens, temperature=0,
                                        echo=True, logprobs=1)
        lp = got.choices[0].logprobs
        assert len(lp.tokens) == len(ids) + max_tokens and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        for i in range(1, len(ids)):
            assert math.isclose(lp.token_logprobs[i], want[i - 1, ids[i]].item(), abs_tol=1e-4)
        assert got.choices[0].text.startswith(reference.tokenizer.decode(ids))
        assert got.usage.completion_tokens == max_tokens


def test_logit_bias_and_penalties_change_greedy_output(client):
    plain = client.completions.create(model="tiny-llama", prompt=[5, 6, 7], max_tokens=4, temperature=0, logprobs=0)
    first = plain.choices[0].logprobs.tokens[0]
    root = str(client.base_url).removesuffix("/v1/")
    tokens = post_json(f"{root}/tokenize", {"prompt": first, "add_special_tokens": False})["tokens"]
    # A ban on the first greedy token changes the first token; a bias of 100 on token 7 makes it win.
    banned = client.completions.create(model="tiny-llama", prompt=[5, 6, 7], max_tokens=4, temperature=0,
                                       logit_bias={str(tokens[0]): -100})
    assert banned.choices[0].text != plain.choices[0].text
    forced = client.completions.create(model="tiny-llama", prompt=[5, 6, 7], max_tokens=3, temperature=0,
                                       logit_bias={"7": 100}, logprobs=0)
    sevens = post_json(f"{root}/detokenize", {"tokens": [7, 7, 7]})["prompt"]
    assert forced.choices[0].text == sevens
    # A frequency penalty of 2 against a bias of 3: token 7 wins once, then loses to the others.
    penalised = client.completions.create(model="tiny-llama", prompt=[5, 6, 7], max_tokens=3, temperature=0,
                                          logit_bias={"7": 3}, frequency_penalty=2.0, logprobs=0)
    assert penalised.choices[0].text != sevens
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny-llama", prompt="a", max_tokens=2, presence_penalty=3)
    assert caught.value.body["param"] == "presence_penalty"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny-llama", prompt="a", max_tokens=2, logit_bias={"99999": 1})
    assert caught.value.body["param"] == 'logit_bias["99999"]'
