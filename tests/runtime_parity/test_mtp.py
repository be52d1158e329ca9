"""DeepSeek-V3's and GLM-4.5's multi-token-prediction layer as a proposer (`--speculative mtp`, issue 44;
runtime/model/mtp.h).

The checkpoints are the tiny DeepSeek-V3 of test_deepseek_parity.py and GLM-4.5 of test_glm4_moe_minimax_parity.py with
an MTP layer `model.layers.<n>` added (runtime_helpers.add_mtp_layer: a sparse decoder layer of its own random
weights, enorm, hnorm, eh_proj, shared_head.norm, its own embed_tokens, and shared_head.head equal to lm_head, as the
output head is shared). transformers does not run the MTP layer, so the reference is built from its pieces:
transformers' decoder layer of the family (DeepseekV3DecoderLayer, Glm4MoeDecoderLayer) with layer n's weights, fed
eh_proj(cat(enorm(embed(t[p + 1])), hnorm(h[p]))) over the whole final sequence (vLLM's layer: the embedding first,
zero at position 0; h the final norm's output), then shared_head.norm and the head. Each proposal strata verified
(--speculation-trace) must be that reference's argmax at its position, and the ids those of decoding without it."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch

import runtime_helpers as H
from test_generate_parity import NEW_TOKENS, PROMPTS, assert_matches

NAME = "deepseek_v3_yarn"


def _layer_prefix(name: str = NAME) -> str:
    return H.mtp_prefix(name)


@pytest.fixture(scope="module")
def references(checkpoint):
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = H.reference_generate(checkpoint(name), PROMPTS, NEW_TOKENS)
        return made[name]

    return get


@pytest.fixture(scope="module")
def mtp_checkpoints(checkpoint, references, tmp_path_factory):
    """mtp_checkpoints(kind, name): the tiny model `name` with an MTP layer, "random" or "bigram" (add_mtp_layer)."""
    made = {}

    def get(kind: str, name: str = NAME):
        if (kind, name) not in made:
            bigram = None
            if kind == "bigram":
                bigram = {}
                for prompt, result in zip(PROMPTS, references(name)):
                    sequence = prompt + result["ids"]
                    bigram.update(zip(sequence[:-1], sequence[1:]))
            made[kind, name] = H.add_mtp_layer(checkpoint(name), tmp_path_factory.mktemp(f"mtp_{kind}") / "model",
                                               bigram)
        return made[kind, name]

    return get


@pytest.fixture(scope="module")
def mtp_checkpoint(mtp_checkpoints):
    return mtp_checkpoints("random")


def reference_mtp(directory, sequence: list[int], name: str) -> tuple[list[int], list[float]]:
    """The MTP layer's argmax at every position p < len(sequence) - 1 (its proposal for token p + 2) and the top-2
    margin there, computed with transformers' pieces."""
    import transformers
    from safetensors import safe_open
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    config = model.config
    n = config.num_hidden_layers
    p = _layer_prefix(name)
    with safe_open(str(directory / "model-mtp.safetensors"), "pt") as f:
        w = {k[len(p):]: f.get_tensor(k) for k in f.keys()}
    layer_class = Glm4MoeDecoderLayer if name.startswith("glm4_moe") else DeepseekV3DecoderLayer
    layer = layer_class(config, layer_idx=n).eval()
    state = {k: v for k, v in w.items() if k.split(".")[0] in ("self_attn", "mlp", "input_layernorm",
                                                                 "post_attention_layernorm")
             and ".experts." not in k}
    experts = config.n_routed_experts
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([w[f"mlp.experts.{e}.gate_proj.weight"], w[f"mlp.experts.{e}.up_proj.weight"]]) for e in
         range(experts)])
    state["mlp.experts.down_proj"] = torch.stack([w[f"mlp.experts.{e}.down_proj.weight"] for e in range(experts)])
    missing, unexpected = layer.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("e_score_correction_bias") for k in missing), (missing, unexpected)
    with torch.no_grad():
        layer.mlp.gate.e_score_correction_bias.copy_(w["mlp.gate.e_score_correction_bias"])

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps))

    ids = torch.tensor([sequence])
    with torch.no_grad():
        h = model.model(input_ids=ids).last_hidden_state[0, :-1]  # the final norm's output, positions 0 .. L - 2
        count = h.shape[0]
        e = w["embed_tokens.weight"][ids[0, 1:]]
        e[0] = 0  # position 0
        x = torch.cat([rms(e, w["enorm.weight"]), rms(h, w["hnorm.weight"])], -1) @ w["eh_proj.weight"].T
        positions = torch.arange(count).unsqueeze(0)
        embeddings = model.model.rotary_emb(x.unsqueeze(0), positions)
        mask = torch.full((count, count), float("-inf")).triu(1)[None, None]
        out = layer(x.unsqueeze(0), attention_mask=mask, position_ids=positions, position_embeddings=embeddings)[0]
        logits = rms(out, w["shared_head.norm.weight"]) @ w["shared_head.head.weight"].T
    two = torch.topk(logits, 2, -1)
    return logits.argmax(-1).tolist(), (two.values[:, 0] - two.values[:, 1]).tolist()


def run_with_trace(directory, tmp_path, *extra, prompts=PROMPTS):
    trace = tmp_path / "trace.jsonl"
    got = H.run_generate(directory, prompts, NEW_TOKENS, "--speculative", "mtp", "--speculative-cost-aware=false",
                         "--speculation-trace", str(trace), *extra)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    return got, lines


@pytest.mark.parametrize("name,kind,plan", [(NAME, "random", "cpu"), (NAME, "random", "3-stage"),
                                            (NAME, "random", "chunked"), (NAME, "bigram", "cpu"),
                                            (NAME, "bigram", "3-stage"), ("glm4_moe_qknorm", "random", "chunked"),
                                            ("glm4_moe_qknorm", "bigram", "3-stage")])
def test_mtp_proposals_match_the_reference_and_keep_the_ids(strata_generate, mtp_checkpoints, references, tmp_path,
                                                            name, kind, plan):
    """Greedy ids and logprobs are transformers' (decoding without the layer), and every proposal strata verified is
    the reference layer's argmax where it was made (the final norm's output and the token after at position at - 2),
    kept exactly when it is the next token. The bigram layer's proposals are mostly kept: the proposals made after a
    kept one (from the bonus position's hidden state and the layer's KV at the kept positions) are checked too."""
    directory = mtp_checkpoints(kind, name)
    extra = {"cpu": ["--device-map", '{"": "cpu"}'],
             "3-stage": ["--device-map", H.layer_device_map(name, [0, 1, 1, 2], 2), "--physical-devices",
                         "0=cpu,1=cpu,2=cpu", "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB"],
             "chunked": ["--device-map", '{"": "cpu"}', "--prefill-chunk", "3"]}[plan]
    if plan == "3-stage":
        # The MTP layer goes with lm_head (device 2): a manual map names it.
        mapping = json.loads(extra[1])
        mapping[_layer_prefix(name)[:-1]] = mapping["lm_head"]
        extra[1] = json.dumps(mapping)
    got, trace = run_with_trace(directory, tmp_path, *extra)
    assert_matches(references(name), got)
    assert got["engine"]["spec_method"] == "mtp"
    assert got["engine"]["spec_verifications"] == len(trace) > 0
    assert got["engine"]["spec_accepted_tokens"] == sum(t["accepted"] for t in trace)
    # One sequence per prompt, numbered in prompt order; the reference over each final sequence.
    order = sorted({t["sequence"] for t in trace})
    assert len(order) == len(PROMPTS), order
    layers = {}
    for t in trace:
        i = order.index(t["sequence"])
        sequence = PROMPTS[i] + got["results"][i]["ids"]
        if i not in layers:
            layers[i] = reference_mtp(directory, sequence, name)
        proposals, margins = layers[i]
        at = t["at"]
        assert len(t["proposed"]) == 1 and len(PROMPTS[i]) < at < len(sequence), t
        assert t["accepted"] == int(sequence[at] == t["proposed"][0]), t
        if margins[at - 2] > 1e-3:  # else a near tie: either id is the layer's
            assert t["proposed"][0] == proposals[at - 2], (t, i, name, plan)
    accepted = sum(t["accepted"] for t in trace)
    if kind == "bigram":
        assert accepted >= len(trace) // 2, trace


def test_mtp_layer_is_planned_with_lm_head_and_its_kv_counted(strata_generate, mtp_checkpoint):
    """--speculative mtp plans the layer (on lm_head's device: the planner keeps it tied to lm_head) and gives it a KV
    layer of its own; without it the layer is neither planned nor loaded."""
    args = ["--physical-devices", "0=cpu,1=cpu,2=cpu", "--max-memory", "0=1GiB,1=1GiB,2=1GiB,cpu=1GiB"]
    plain = H.run_generate(mtp_checkpoint, PROMPTS[:1], 2, *args)
    got = H.run_generate(mtp_checkpoint, PROMPTS[:1], 2, *args, "--speculative", "mtp")
    layer = _layer_prefix()[:-1]
    assert layer not in plain["load"]["device_map"]
    assert plain["load"]["ignored_tensors"] > 0
    assert got["load"]["device_map"][layer] == got["load"]["device_map"]["lm_head"], got["load"]["device_map"]
    assert got["load"]["ignored_tensors"] == 0
    n = H.CONFIGS[NAME][1]["num_hidden_layers"]
    assert got["load"]["kv_cache_bytes"] * n == plain["load"]["kv_cache_bytes"] * (n + 1)
    assert "multi-token prediction" in got["load"]["stages"]
    assert got["results"][0]["ids"] == plain["results"][0]["ids"]


def test_mtp_on_a_model_without_one_exits_2_naming_what_is_missing(strata_generate, checkpoint, tmp_path):
    """transformers writes num_nextn_predict_layers: 1 into every DeepSeek-V3 config.json but never the layer: asked
    for it, such a checkpoint exits 2 naming a tensor it lacks; a config without the field (or 0) names the field."""
    proc = H.run_generate(checkpoint(NAME), PROMPTS[:1], 2, "--speculative", "mtp", check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"tensor {_layer_prefix()}" in proc.stderr and "is missing" in proc.stderr, proc.stderr
    target = tmp_path / "model"
    shutil.copytree(checkpoint(NAME), target)
    config = json.loads((target / "config.json").read_text())
    config["num_nextn_predict_layers"] = 0
    (target / "config.json").write_text(json.dumps(config))
    proc = H.run_generate(target, PROMPTS[:1], 2, "--speculative", "mtp", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "num_nextn_predict_layers" in proc.stderr and "--speculative mtp" in proc.stderr, proc.stderr
    assert H.run_generate(target, PROMPTS[:1], 2)["results"][0]["ids"]


def test_mtp_layer_apart_from_lm_head_exits_2_naming_both(strata_generate, mtp_checkpoint):
    mapping = json.loads(H.layer_device_map(NAME, [0, 0, 1, 1], 1))
    mapping[_layer_prefix()[:-1]] = 0
    proc = H.run_generate(mtp_checkpoint, PROMPTS[:1], 2, "--speculative", "mtp", "--device-map", json.dumps(mapping),
                          "--physical-devices", "0=cpu,1=cpu", "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB", check=False)
    assert proc.returncode == 2, proc.stderr
    assert _layer_prefix()[:-1] in proc.stderr and "lm_head" in proc.stderr, proc.stderr


def test_prefix_cache_hits_keep_the_ids(strata_generate, mtp_checkpoints, tmp_path):
    """Prompts that share whole KV blocks (16 positions) reuse them, the MTP layer's KV of those blocks included
    (computed with the first prompt's next token after each block): the proposals may differ from a fresh run's, the
    ids may not (transformers' greedy, each prompt alone)."""
    directory = mtp_checkpoints("bigram")
    shared = [(7 * i + 3) % 250 + 1 for i in range(33)]
    # One at a time (--max-batch 1): the second reuses the first's first block, after which its next token differs.
    prompts = [shared + [11, 12], shared[:16] + [90, 91, 92], shared + [40]]
    expected = H.reference_generate(directory, prompts, NEW_TOKENS)
    got, trace = run_with_trace(directory, tmp_path, "--device-map", '{"": "cpu"}', "--prefix-cache", "--max-batch",
                                "1", prompts=prompts)
    assert [r["ids"] for r in got["results"]] == [e["ids"] for e in expected]
    assert got["engine"]["prefix_hit_tokens"] >= 32, got["engine"]
    assert trace
