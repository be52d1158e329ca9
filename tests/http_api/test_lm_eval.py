"""lm-evaluation-harness (PyPI lm_eval) drives strata through its local-completions model (echo + logprobs
on /v1/completions) on a small multiple-choice task the test writes to a local JSON file; its per-item
log-likelihoods and accuracy must equal lm-eval's own hf model on the same checkpoint (float32: 1e-4)."""

from __future__ import annotations

import json
import random
import shutil

import pytest

CHOICES = ["red", "green", "blue", "yellow"]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, chat_model):
    directory = tmp_path_factory.mktemp("lm_eval_task")
    rng = random.Random(7)
    with open(directory / "items.jsonl", "w") as out:
        for i in range(12):
            words = " ".join(rng.choice(["the", "sky", "grass", "is", "a", "colour", "of", "sea"]) for _ in range(6))
            out.write(json.dumps({"question": f"Q{i}: {words}?", "answer": rng.randrange(len(CHOICES))}) + "\n")
    (directory / "strata_colours.yaml").write_text(f"""task: strata_colours
dataset_path: json
dataset_kwargs:
  data_files:
    test: {directory / "items.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}} Answer:"
doc_to_choice: {json.dumps(CHOICES)}
doc_to_target: answer
metric_list:
  - metric: acc
""")
    # lm-eval's tokenizer for both models, read by transformers from a copy of the checkpoint (the server's
    # own directory stays as the other tests have it).
    checkpoint = directory / "checkpoint"
    shutil.copytree(chat_model, checkpoint)
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>"}))
    return directory


def run(model: str, model_args: str, task_dir) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["strata_colours"],
                                      task_manager=TaskManager(include_path=str(task_dir)), log_samples=True,
                                      batch_size=1, num_fewshot=0)
    samples = results["samples"]["strata_colours"]
    return {"acc": results["results"]["strata_colours"]["acc,none"],
            "loglikelihoods": {s["doc_id"]: [r[0][0] for r in s["resps"]] for s in samples}}


def test_lm_eval_local_completions_equals_its_hf_model(http_server, task_dir):
    checkpoint = task_dir / "checkpoint"
    # Both with the tokenizer's <bos> (lm-eval's hf model adds it by default, its API models do not).
    hf = run("hf", f"pretrained={checkpoint},dtype=float32,device=cpu,add_bos_token=True", task_dir)
    strata = run("local-completions",
                 f"model=tiny-llama,base_url={http_server.http_url}/v1/completions,tokenizer={checkpoint},"
                 "tokenizer_backend=huggingface,add_bos_token=True,num_concurrent=4,max_retries=1", task_dir)
    assert strata["acc"] == hf["acc"]
    assert set(strata["loglikelihoods"]) == set(hf["loglikelihoods"]) and len(hf["loglikelihoods"]) == 12
    for doc, want in hf["loglikelihoods"].items():
        got = strata["loglikelihoods"][doc]
        assert len(got) == len(CHOICES)
        assert all(abs(float(g) - float(w)) < 1e-4 for g, w in zip(got, want)), (doc, got, want)
