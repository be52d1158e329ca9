"""strata-generate against transformers generate(do_sample=False) on the same checkpoint: greedy ids
identical and logprobs within 1e-4 (float32), for >= 4 prompts of different lengths run as one batch
x 16 new tokens, under a single CPU plan, 2- and 4-stage plans on logical devices, and a manual map with
"cpu" and "disk" entries."""

from __future__ import annotations


import pathlib

import pytest
import torch

import runtime_helpers as H

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112], [42],
           [17, 200, 33, 64, 9]]
NEW_TOKENS = 16
LOGPROB_TOLERANCE = 1e-4


def _layers(name: str) -> int:
    return H.CONFIGS[name][1]["num_hidden_layers"]


def _tied(name: str) -> bool:
    return bool(H.CONFIGS[name][1].get("tie_word_embeddings"))


def plan_args(name: str, plan: str) -> list[str]:
    n = _layers(name)
    if plan == "cpu":
        return ["--device-map", '{"": "cpu"}']
    if plan == "two_stage":
        devices = [0 if i < n // 2 else 1 for i in range(n)]
        return ["--device-map", H.layer_device_map(name, devices, 1), "--physical-devices", "0=cpu,1=cpu",
                "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB"]
    if plan == "four_stage":
        devices = [min(3, i * 4 // n) for i in range(n)]
        return ["--device-map", H.layer_device_map(name, devices, 3), "--physical-devices", "0=cpu,1=cpu,2=cpu,3=cpu",
                "--max-memory", "0=1GiB,1=1GiB,2=1GiB,3=1GiB,cpu=1GiB"]
    if plan == "offload":
        devices = [0, "cpu", "disk"] + [0] * (n - 3)
        return ["--device-map", H.layer_device_map(name, devices, 0), "--physical-devices", "0=cpu",
                "--max-memory", "0=1GiB,cpu=1GiB,disk=1GiB"]
    if plan == "balanced":
        # The planner's own strategy over 3 logical GPUs with budgets too small for one.
        return ["--device-map", "balanced", "--physical-devices", "0=cpu,1=cpu,2=cpu",
                "--max-memory", "0=400KB,1=400KB,2=400KB,cpu=1GiB"]
    raise ValueError(plan)


EXPECTED_STAGES = {"cpu": 1, "two_stage": 2, "four_stage": 4, "offload": 4}


def assert_matches(reference, got, tolerance=LOGPROB_TOLERANCE):
    assert len(got["results"]) == len(reference)
    for i, (ref, res) in enumerate(zip(reference, got["results"])):
        assert res["ids"] == ref["ids"], f"prompt {i}: ids differ"
        worst = max(abs(a - b) for a, b in zip(ref["logprobs"], res["logprobs"]))
        assert worst <= tolerance, f"prompt {i}: logprob differs by {worst}"


@pytest.fixture(scope="module")
def references(checkpoint):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = H.reference_generate(checkpoint(name), PROMPTS, NEW_TOKENS, top_k=3)
        return cache[name]

    return get


@pytest.mark.parametrize("plan", ["cpu", "two_stage", "four_stage", "offload"])
@pytest.mark.parametrize("name", list(H.CONFIGS))
def test_greedy_matches_transformers(strata_generate, checkpoint, references, name, plan):
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--top-logprobs", "3", *plan_args(name, plan))
    assert_matches(references(name), got)
    stages = got["load"]["stages"].splitlines()
    expected = EXPECTED_STAGES[plan] + (1 if _tied(name) and plan in ("two_stage", "four_stage") else 0)
    assert len(stages) == expected, got["load"]["stages"]
    # top_logprobs: best first, the chosen id first among them, values as transformers' top-3.
    for ref, res in zip(references(name), got["results"]):
        for step, top in enumerate(res["top_logprobs"]):
            assert top[0][0] == res["ids"][step]
            assert [t[0] for t in top] == [t[0] for t in ref["top"][step]]
            assert max(abs(a[1] - b[1]) for a, b in zip(top, ref["top"][step])) <= LOGPROB_TOLERANCE


@pytest.mark.parametrize("method", ["ngram", "draft"])
@pytest.mark.parametrize("name", list(H.CONFIGS))
def test_speculative_decoding_keeps_transformers_greedy_ids_on_every_family(strata_generate, checkpoint, references,
                                                                            name, method):
    # Issue 44: proposals verified K + 1 positions a pass (n-gram lookup; the model as its own draft, planned beside
    # it) on a 2-stage plan: the ids are transformers' greedy ones (its prompt lookup and assisted generation keep
    # them too), logprobs within the tolerance, and proposals were verified.
    proposer = ["--speculative", "ngram"] if method == "ngram" else ["--draft-model", str(checkpoint(name))]
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, *plan_args(name, "two_stage"), *proposer,
                         "--num-speculative-tokens", "4", "--speculative-cost-aware=false")
    assert_matches(references(name), got)
    engine = got["engine"]
    assert engine["spec_proposed_tokens"] > 0, engine
    if method == "draft":
        assert engine["spec_accepted_tokens"] > 0, engine


def test_every_architecture_has_a_parity_row(tmp_path):
    """Every architecture strata-plan supports (its own error lists them) is the class of a CONFIGS row, so the
    parity above covers each family (tests/runtime/unit_test.cc checks each family has a registry row)."""
    import subprocess

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"]}')
    proc = subprocess.run([str(H.build_dir() / "planner" / "strata-plan"), "--model", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    supported = proc.stderr.split("(supported: ")[1].split(")")[0].split(", ")
    covered = set()
    for config_class, kwargs in H.CONFIGS.values():
        config = getattr(transformers, config_class)(**kwargs)
        covered.add(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])
    assert len(supported) >= 10, supported
    missing = [a for a in supported if a not in covered]
    assert not missing, f"architectures without a runtime_helpers.CONFIGS row: {missing}"


def test_planner_strategy_spreads_over_logical_devices(strata_generate, checkpoint, references):
    name = "llama_llama3_gqa"
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, *plan_args(name, "balanced"))
    assert len(got["load"]["stages"].splitlines()) >= 2, got["load"]["stages"]
    assert_matches(references(name), got)


@pytest.mark.parametrize("name", ["llama_llama3_gqa", "qwen3_moe_mixed"])
def test_offloaded_weights_in_another_dtype_go_through_the_offload_slots(strata_generate, checkpoint, name):
    """A bfloat16 checkpoint served in float32 with cpu and disk entries: each "disk" unit's weights are cast into one
    of its stage's two persistent slots on every use (runtime/model/weights.h, OffloadBuffers), not into fresh
    tensors; the output is transformers' on the same checkpoint in float32."""
    directory = checkpoint(name, torch.bfloat16)
    reference = H.reference_generate(directory, PROMPTS, NEW_TOKENS, dtype=torch.float32, top_k=3)
    got = H.run_generate(directory, PROMPTS, NEW_TOKENS, "--dtype", "float32", *plan_args(name, "offload"))
    assert_matches(reference, got)
    stages = got["load"]["stages"].splitlines()
    slots = [line for line in stages if "offloaded weights through 2 slots of" in line]
    assert len(slots) == 1 and "plan device disk" in slots[0], stages
    # Two slots of the disk stage's largest unit on the (CPU) device; nothing pinned without a GPU.
    assert got["load"]["offload_slot_bytes"] > 0 and got["load"]["pinned_bytes"] == 0, got["load"]


def test_cpu_weights_are_copied_into_huge_pages(strata_generate, checkpoint):
    """CPU weights leave the mapping's 4 KiB page-cache pages for 2 MiB ones (runtime/model/weights.h), where the
    kernel has transparent huge pages on: AnonHugePages then holds at least the weights' whole 2 MiB pages."""
    got = H.run_generate(checkpoint("llama_llama3_gqa"), PROMPTS[:1], 2, "--device-map", '{"": "cpu"}')
    assert got["load"]["copied_tensors"] > 0
    thp = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[never]" not in thp.read_text():
        weights = sum(f.stat().st_size for f in checkpoint("llama_llama3_gqa").glob("*.safetensors"))
        # a checkpoint of this size fills whole chunks of the arena only in part: at least one 2 MiB page
        assert got["load"]["huge_page_bytes"] >= min(2 << 20, weights // 2), got["load"]


def test_sharded_checkpoint_really_is_sharded(checkpoint):
    assert (checkpoint("llama_sharded") / "model.safetensors.index.json").is_file()
    assert len(list(checkpoint("llama_sharded").glob("model-*.safetensors"))) >= 2


@pytest.mark.parametrize("name", ["llama_llama3_gqa", "qwen2_bias_tied", "mistral_sliding"])
def test_batch_invariance(strata_generate, checkpoint, name):
    batch = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}')
    for i, prompt in enumerate(PROMPTS):
        alone = H.run_generate(checkpoint(name), [prompt], NEW_TOKENS, "--device-map", '{"": "cpu"}')
        assert alone["results"][0]["ids"] == batch["results"][i]["ids"], f"prompt {i}"
        worst = max(abs(a - b) for a, b in zip(alone["results"][0]["logprobs"], batch["results"][i]["logprobs"]))
        assert worst <= LOGPROB_TOLERANCE


def test_prompts_beyond_max_batch_run_in_several_batches(strata_generate, checkpoint, references):
    name = "llama_llama3_gqa"
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--max-batch", "2")
    assert_matches(references(name), got)


def test_mistral_window_is_shorter_than_the_sequence():
    assert H.CONFIGS["mistral_sliding"][1]["sliding_window"] < max(len(p) for p in PROMPTS) + NEW_TOKENS


@pytest.mark.parametrize("name", ["llama_llama3_gqa", "qwen2_bias_tied"])
def test_bfloat16_agrees_where_the_margin_exceeds_bf16_noise(strata_generate, checkpoint, name):
    """bfloat16 on the CPU, ids compared where transformers' margin exceeds bf16 noise
    (runtime_helpers.compare_bfloat16_by_margin)."""
    ckpt = checkpoint(name, torch.bfloat16)
    reference = H.reference_generate(ckpt, PROMPTS, NEW_TOKENS, dtype=torch.bfloat16)
    got = H.run_generate(ckpt, PROMPTS, NEW_TOKENS, "--device-map", '{"": "cpu"}', "--dtype", "bfloat16")
    assert got["load"]["dtype"] == "bfloat16"
    compared = H.compare_bfloat16_by_margin(reference, got["results"], NEW_TOKENS)
    print(f"bfloat16 {name}: {compared} of {NEW_TOKENS * len(PROMPTS)} steps above the noise margin, all identical")


@pytest.mark.parametrize("name", ["llama_llama3_gqa", "qwen2_bias_tied"])
def test_two_logical_stages_on_one_gpu(strata_generate, checkpoint, references, name):
    """Two stages on one CUDA device: separate streams, an event between them, the same results."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the streams-and-events path runs on a GPU machine")
    n = _layers(name)
    devices = [0 if i < n // 2 else 1 for i in range(n)]
    got = H.run_generate(checkpoint(name), PROMPTS, NEW_TOKENS, "--device-map", H.layer_device_map(name, devices, 1),
                         "--physical-devices", "0=cuda:0,1=cuda:0", "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB",
                         "--dtype", "float32")
    assert "cuda:0" in got["load"]["stages"]
    # TF32 is off in LibTorch by default; CUDA kernels still sum in another order than the CPU.
    assert_matches(references(name), got, tolerance=1e-3)


def test_llama_attention_and_mlp_biases(strata_generate, tmp_path):
    """LlamaConfig's attention_bias puts a bias on q, k, v and o, and mlp_bias on gate, up and down: every
    one is read (before the unit runners took their weights from the module tree, o's and the MLP's were
    dropped without a word)."""
    import transformers

    config = transformers.LlamaConfig(**dict(H.CONFIGS["llama_llama3_gqa"][1], attention_bias=True, mlp_bias=True))
    H.save_random_model(tmp_path, config)
    reference = H.reference_generate(tmp_path, PROMPTS[:3], 8)
    assert_matches(reference, H.run_generate(tmp_path, PROMPTS[:3], 8, "--device-map", '{"": "cpu"}'))
