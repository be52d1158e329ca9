"""DeepSeek-V3 (MLA's latent KV pool, DeepSeekMoE) served over the OpenAI HTTP API: sixteen concurrent streamed
completions (each prompt twice, the second time a prefix-cache hit) whose texts equal transformers' greedy
generate() on the same tiny random checkpoint and tokenizer."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

import runtime_helpers as RH

PROMPTS = ["the quick brown fox", "a b c d e f", "hello world, hello", "1 2 3 4 5 6 7 8 9", "strata serves",
           "pipelines and stages", "x", "latent attention keeps one row"]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def deepseek_model(tmp_path_factory):
    import transformers

    config_class, kwargs = RH.CONFIGS["deepseek_v3_yarn"]
    config = getattr(transformers, config_class)(**dict(kwargs, vocab_size=320))
    directory = tmp_path_factory.mktemp("deepseek_http")
    model = RH.random_model(config, seed=3, vectors=False)  # with random routing biases
    model.save_pretrained(directory, safe_serialization=True)
    RH.train_tokenizer(vocab_size=300).save(str(directory / "tokenizer.json"))
    return directory


def test_sixteen_concurrent_streams_equal_transformers(server_factory, deepseek_model):
    import openai
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(deepseek_model / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(deepseek_model, dtype=torch.float32).eval()
    want = {}
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=0, eos_token_id=None)
        want[prompt] = tokenizer.decode(out[0, len(ids):].tolist())

    server = server_factory(["--model", str(deepseek_model), "--served-model-name", "tiny-deepseek", "--max-context",
                             "256", "--max-batch", "16", "--prefill-chunk", "8", "--device-map", '{"": "cpu"}'])
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def stream(prompt: str) -> str:
        chunks = client.completions.create(model="tiny-deepseek", prompt=prompt, max_tokens=NEW_TOKENS,
                                           temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks if c.choices)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(stream, PROMPTS + PROMPTS))
    for i, text in enumerate(texts):
        assert text == want[PROMPTS[i % len(PROMPTS)]], f"stream {i}"
