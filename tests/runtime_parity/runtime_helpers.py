"""Shared by the runtime parity tests: tiny random checkpoints, the strata-generate binary, and
transformers' own greedy generation on the same checkpoint as the oracle."""

from __future__ import annotations

import json
import shutil
import os
import pathlib
import subprocess

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("STRATA_BUILD_DIR", REPO / "build"))


def generate_path() -> pathlib.Path:
    return build_dir() / "runtime" / "strata-generate"


# Tiny configs, one per case the issue names. eos/bos are None so that both sides run exactly
# max_new_tokens; pad_token_id 0 is only transformers' padding for batched prompts.
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-5,
               bos_token_id=None, eos_token_id=None, pad_token_id=0)

CONFIGS = {
    "llama_llama3_gqa": ("LlamaConfig", dict(_COMMON, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "llama_linear_head_dim": ("LlamaConfig", dict(_COMMON, head_dim=24, rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "mistral_sliding": ("MistralConfig", dict(_COMMON, sliding_window=5)),
    "qwen2_bias_tied": ("Qwen2Config", dict(_COMMON, tie_word_embeddings=True, use_sliding_window=True,
                                             sliding_window=6, max_window_layers=2)),
    "llama_sharded": ("LlamaConfig", dict(_COMMON, num_hidden_layers=3)),
    # Room for a byte-level tokenizer (256 byte tokens + merges + specials) beside it.
    "llama_text": ("LlamaConfig", dict(_COMMON, vocab_size=320)),
    # Qwen3 / Qwen3-MoE / Mixtral (tests/runtime_parity/test_moe_parity.py): sliding layers, more experts
    # than top_k, dense layers among sparse ones, norm_topk_prob both ways, a tied head, attention biases.
    "qwen3_sliding": ("Qwen3Config", dict(_COMMON, head_dim=16, use_sliding_window=True, sliding_window=6,
                                          layer_types=["full_attention", "sliding_attention", "full_attention",
                                                       "sliding_attention"])),
    "qwen3_moe_mixed": ("Qwen3MoeConfig", dict(_COMMON, moe_intermediate_size=32, num_experts=6,
                                               num_experts_per_tok=2, mlp_only_layers=[2], norm_topk_prob=True,
                                               use_sliding_window=True, sliding_window=6, attention_bias=True)),
    "qwen3_moe_step_tied": ("Qwen3MoeConfig", dict(_COMMON, moe_intermediate_size=32, num_experts=4,
                                                   num_experts_per_tok=3, decoder_sparse_step=2,
                                                   norm_topk_prob=False, tie_word_embeddings=True)),
    "mixtral_sliding": ("MixtralConfig", dict(_COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=5)),
    # Gemma 2: both soft-caps active, sliding (layers 0, 2) and global layers, query_pre_attn_scalar != head_dim.
    "gemma2_softcap": ("Gemma2Config", dict(_COMMON, head_dim=16, sliding_window=5, query_pre_attn_scalar=24,
                                            attn_logit_softcapping=5.0, final_logit_softcapping=4.0,
                                            tie_word_embeddings=True)),
    # Gemma 3: q/k norms, every second layer global with linear-scaled RoPE (theta 1e6), sliding layers
    # with their own base (rope_local_base_freq), the final soft-cap.
    "gemma3_qknorm": ("Gemma3TextConfig", dict(_COMMON, head_dim=16, sliding_window=5, sliding_window_pattern=2,
                                                query_pre_attn_scalar=16, final_logit_softcapping=6.0,
                                                tie_word_embeddings=True, rope_parameters={
                                                    "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                       "rope_theta": 1000000.0},
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 10000.0}})),
    # DeepSeek-V3 (tests/runtime_parity/test_deepseek_parity.py): MLA with a low-rank query and YaRN (an mscale
    # that scales cos/sin and an mscale_all_dim that scales the softmax), interleaved RoPE; DeepSeekMoE with 4 groups
    # of 2 experts, 2 groups kept, random correction biases (make_checkpoint), a dense first layer, shared experts.
    "deepseek_v3_yarn": ("DeepseekV3Config", dict(
        _COMMON, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, routed_scaling_factor=2.5,
        kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 0.8,
                         "beta_fast": 32, "beta_slow": 1})),
    # The full-rank query (q_lora_rank null), halves RoPE, attention biases, unnormalised top-k, a tied head.
    "deepseek_v3_plain": ("DeepseekV3Config", dict(
        _COMMON, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=8, n_group=2, topk_group=1,
        num_experts_per_tok=3, first_k_dense_replace=2, n_shared_experts=2, routed_scaling_factor=1.5,
        kv_lora_rank=24, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
        rope_interleave=False, attention_bias=True, norm_topk_prob=False, tie_word_embeddings=True)),
    # GLM-4.5 (tests/runtime_parity/test_glm4_moe_parity.py): half of each head rotated, per-head q/k norms, q/k/v
    # biases without o's, DeepSeekMoE with 2 groups of 4 experts (1 kept), random correction biases, a dense first
    # layer, shared experts; and the -Air shape: no q/k norms or biases, one group, two shared experts, unnormalised
    # top-k, a tied head.
    "glm4_moe_qknorm": ("Glm4MoeConfig", dict(
        _COMMON, head_dim=16, moe_intermediate_size=32, n_routed_experts=8, n_group=2, topk_group=1,
        num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, routed_scaling_factor=2.5,
        use_qk_norm=True, attention_bias=True, partial_rotary_factor=0.5)),
    "glm4_moe_air": ("Glm4MoeConfig", dict(
        _COMMON, moe_intermediate_size=32, n_routed_experts=6, n_group=1, topk_group=1, num_experts_per_tok=3,
        first_k_dense_replace=2, n_shared_experts=2, routed_scaling_factor=1.0, norm_topk_prob=False,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 500000.0,
                                                   "partial_rotary_factor": 0.25})),
    # MiniMax-M2 (tests/runtime_parity/test_minimax_m2_parity.py): q/k norms across all heads, half of each head
    # rotated (the legacy rotary_dim), a sparse block in every layer with a sigmoid router and random correction biases.
    "minimax_m2_partial": ("MiniMaxM2Config", dict(
        _COMMON, head_dim=16, rotary_dim=8, intermediate_size=32, num_local_experts=6, num_experts_per_tok=2)),
    # gpt-oss (tests/runtime_parity/test_gpt_oss_parity.py): sinks, sliding (window 5) and full layers alternating, YaRN
    # over 16 original positions without truncation (prompts and outputs pass it), biases everywhere, a biased router
    # over 6 experts (top 2), experts with interleaved gate/up and a clamped SwiGLU (limit 7: reached by the scaled
    # weights).
    "gpt_oss_sinks": ("GptOssConfig", dict(
        _COMMON, head_dim=16, intermediate_size=32, num_local_experts=6, num_experts_per_tok=2, sliding_window=5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})),
    # Phi-3: fused projections, half the head rotated, longrope (short factors below 64 tokens, the
    # attention factor of max_position_embeddings / 64), a sliding window on every layer.
    "phi3_longrope": ("Phi3Config", dict(_COMMON, sliding_window=9, partial_rotary_factor=0.5,
                                         original_max_position_embeddings=64, rope_parameters={
                                             "rope_type": "longrope", "rope_theta": 10000.0,
                                             "short_factor": [1.0, 1.1, 1.5, 2.0],
                                             "long_factor": [1.5, 3.0, 6.0, 12.0]})),
}


def random_model(config, seed: int = 1, vectors: bool = True):
    """A random float32 model of `config`: matrices scaled up (well-separated top tokens) and, with `vectors`,
    every 1-d parameter (norms, biases) uniform in [-0.5, 0.5] so that each one matters."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
            elif vectors:
                p.uniform_(-0.5, 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.3, 0.3)  # DeepSeekMoE's routing biases (zeros at init): group choices depend on them
    return model


def save_random_model(directory: pathlib.Path, config, seed: int = 1, vectors: bool = True) -> pathlib.Path:
    """random_model(config, seed, vectors) saved by transformers."""
    random_model(config, seed, vectors).save_pretrained(directory, safe_serialization=True)
    return directory


def make_checkpoint(directory: pathlib.Path, name: str, dtype=torch.float32, seed: int = 0) -> pathlib.Path:
    import transformers

    config_class, kwargs = CONFIGS[name]
    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init at transformers' std (0.02) gives near-uniform logits; scale up so the top tokens are
    # well separated and greedy choices are not decided by rounding.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
            elif name.startswith("gemma"):
                p.uniform_(-0.5, 0.5)  # Gemma norms scale by (1 + weight), initialised to zeros
            elif name.startswith("gpt_oss") and p.dim() == 1 and p.numel() == config.num_attention_heads:
                p.uniform_(-1.0, 1.0)  # the sinks (torch.empty at init)
        if name.startswith("gpt_oss"):
            for layer in model.model.layers:
                layer.mlp.experts.gate_up_proj.mul_(4.0)  # gate and up values past swiglu_limit, so the clamps matter
        for buffer_name, b in model.named_buffers():
            if buffer_name.endswith("e_score_correction_bias"):
                b.uniform_(-0.3, 0.3)  # DeepSeekMoE's routing biases (zeros at init): group choices depend on them
    model = model.to(dtype)
    shard = "40KB" if name == "llama_sharded" else "10GB"
    model.save_pretrained(directory, safe_serialization=True, max_shard_size=shard)
    return directory


def reference_generate(directory: pathlib.Path, prompts: list[list[int]], new_tokens: int, dtype=torch.float32,
                       top_k: int = 0, device: str = "cpu"):
    """transformers generate(do_sample=False) on left-padded prompts, with the model and inputs on
    `device`: per prompt, the new ids, their log-probabilities (log_softmax of the raw float32 logits)
    and the top-2 margin of each step."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, device_map={"": device})
    model.eval()
    longest = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    results = []
    for i in range(len(prompts)):
        new = out.sequences[i, longest:].tolist()
        logprobs, margins, top, top1 = [], [], [], []
        for step, logits in enumerate(out.logits):
            row = logits[i].float().cpu()
            lp = torch.log_softmax(row, -1)
            logprobs.append(lp[new[step]].item())
            two = torch.topk(row, 2).values
            margins.append((two[0] - two[1]).item())
            top1.append(two[0].item())
            if top_k:
                v, k = torch.topk(lp, top_k)
                top.append(list(zip(k.tolist(), v.tolist())))
        results.append({"ids": new, "logprobs": logprobs, "margins": margins, "top": top, "top1": top1})
    del model
    if device != "cpu":
        torch.cuda.empty_cache()
    return results


def compare_bfloat16_by_margin(reference: list[dict], results: list[dict], new_tokens: int) -> int:
    """bfloat16 has an 8-bit significand: two logits closer than a few units in the last place of their
    magnitude may swap under any change in summation order. Ids are compared step by step until the first
    step where transformers' own top-1/top-2 margin is below 2^-6 x max(1, |top-1 logit|) (2 bf16 ulps at
    that magnitude); past it the continuations may legitimately differ. At least one step per prompt on
    average must be above that margin, so that something is compared. Returns the steps compared."""
    compared = 0
    for i, (ref, res) in enumerate(zip(reference, results)):
        for step in range(new_tokens):
            if ref["margins"][step] < 2 ** -6 * max(1.0, abs(ref["top1"][step])):
                break
            assert res["ids"][step] == ref["ids"][step], f"prompt {i} step {step}: margin {ref['margins'][step]}"
            assert abs(res["logprobs"][step] - ref["logprobs"][step]) < 0.1
            compared += 1
    assert compared >= len(reference), f"only {compared} steps were above the bf16 noise margin"
    return compared


def run_generate(model_dir: pathlib.Path, prompts: list[list[int]], new_tokens: int, *extra: str,
                 check: bool = True):
    args = [str(generate_path()), "--model", str(model_dir), "--max-new-tokens", str(new_tokens), "--json"]
    for p in prompts:
        args += ["--prompt-ids", ",".join(str(t) for t in p)]
    args += list(extra)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if not check:
        return proc
    assert proc.returncode == 0, f"strata-generate failed ({proc.returncode}): {proc.stderr}"
    return json.loads(proc.stdout)


def train_tokenizer(vocab_size: int):
    """A byte-level BPE with <bos>/<eos> specials and a <bos> post-processor (Llama-3's layout),
    trained on text written here; for the tests that need text in and out beside a tiny checkpoint."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [f"The quick brown fox jumps over the lazy dog {i}. Hello, world! Ünïcödé 🚀" for i in range(200)]
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    return tok


def layer_device_map(name: str, layer_devices: list, head) -> str:
    """A manual device_map (JSON) for CONFIGS[name]: embeddings with the first layer, layer i on
    layer_devices[i], the final norm and rotary embedding on `head`; a tied LM head shares the embedding's
    storage, so it sits with it (the planner checks), an untied one on `head`."""
    entries = {"model.embed_tokens": layer_devices[0]}
    for i, d in enumerate(layer_devices):
        entries[f"model.layers.{i}"] = d
    entries["model.norm"] = head
    entries["model.rotary_emb"] = head
    entries["lm_head"] = layer_devices[0] if CONFIGS[name][1].get("tie_word_embeddings") else head
    return json.dumps(entries)


def mtp_prefix(name: str) -> str:
    """The tensors' prefix of CONFIGS[name]'s multi-token-prediction layer: model.layers.<num_hidden_layers>."""
    return f"model.layers.{CONFIGS[name][1]['num_hidden_layers']}."


def add_mtp_layer(source: pathlib.Path, target: pathlib.Path, bigram: dict | None = None) -> pathlib.Path:
    """A copy of `source` (a DeepSeek-V3 or GLM-4.5 checkpoint whose last layer is sparse) with an MTP layer
    model.layers.<num_hidden_layers> of random weights in a shard of its own, declared in config.json. With `bigram`
    (token -> the token that follows it in the target's own greedy outputs), the layer mostly predicts that successor:
    its embedding of a is lm_head's row of bigram[a], eh_proj passes the embedding half on, and the decoder layer's own
    contributions are scaled down (every piece still counts in the reference), so that many proposals are accepted."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(source, target)
    config = json.loads((source / "config.json").read_text())
    n, hidden, vocab = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    index = source / "model.safetensors.index.json"
    weight_map = (json.loads(index.read_text())["weight_map"] if index.exists()
                  else {k: "model.safetensors" for k in safe_open(str(source / "model.safetensors"), "pt").keys()})
    generator = torch.Generator().manual_seed(7)
    small = 0.05 if bigram else 1.0
    mtp = {}
    p = f"model.layers.{n}."
    last = f"model.layers.{n - 1}."
    files = {}

    def tensor_of(name: str):
        if weight_map[name] not in files:
            files[weight_map[name]] = safe_open(str(source / weight_map[name]), "pt")
        return files[weight_map[name]].get_tensor(name)

    # The last layer is sparse, as the MTP layer is: its tensors' names and shapes, new random values.
    for tensor in weight_map:
        if not tensor.startswith(last):
            continue
        like = tensor_of(tensor)
        if tensor.endswith("e_score_correction_bias"):
            value = torch.rand(like.shape, generator=generator) * 0.6 - 0.3
        elif like.dim() > 1:
            value = torch.randn(like.shape, generator=generator) * like.float().std()
            if tensor.endswith(("o_proj.weight", "down_proj.weight")):
                value *= small
        else:
            value = torch.rand(like.shape, generator=generator) - 0.5
        mtp[p + tensor[len(last):]] = value.to(like.dtype).contiguous()
    head = tensor_of("lm_head.weight") if "lm_head.weight" in weight_map else tensor_of("model.embed_tokens.weight")
    dtype = head.dtype
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"{p}{norm}.weight"] = (torch.rand(hidden, generator=generator) + 0.5).to(dtype)
    eh = torch.randn(hidden, 2 * hidden, generator=generator) * 0.16
    embed = torch.randn(vocab, hidden, generator=generator) * 0.16
    if bigram:
        eh[:, :hidden] = torch.eye(hidden) * 4
        eh[:, hidden:] *= small
        for a, b in bigram.items():
            embed[a] = head[b].float() / mtp[f"{p}enorm.weight"].float()
    mtp[f"{p}eh_proj.weight"] = eh.to(dtype)
    mtp[f"{p}embed_tokens.weight"] = embed.to(dtype)
    mtp[f"{p}shared_head.head.weight"] = head.clone()
    save_file(mtp, str(target / "model-mtp.safetensors"), metadata={"format": "pt"})
    weight_map.update({k: "model-mtp.safetensors" for k in mtp})
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config["num_nextn_predict_layers"] = 1
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target
