"""Writes strata's demo checkpoint: a tiny Llama with RANDOM weights (its text is gibberish) and a
byte-level BPE tokenizer.json trained on this repository's Markdown, so that scripts/serve.sh can serve
Generate end to end with nothing downloaded.

    python scripts/make_demo_model.py [DIR]     # default ~/.cache/strata/demo-model

Idempotent: a complete directory (its marker written last) is left as it is. The checkpoint is written
into a temporary sibling and renamed, so an interrupted run leaves nothing half-made behind.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = "strata-demo.json"
VOCAB = 2048


def _corpus() -> list[str]:
    lines = []
    for path in sorted(REPO.rglob("*.md")):
        if path.relative_to(REPO).parts[0].startswith("build"):
            continue
        lines += [line for line in path.read_text(errors="ignore").splitlines() if line.strip()]
    return lines


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def make(directory: Path) -> Path:
    if (directory / MARKER).is_file():
        return directory
    import torch
    import transformers

    tok = _tokenizer()
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                                      num_attention_heads=8, num_key_value_heads=4, vocab_size=tok.get_vocab_size(),
                                      max_position_embeddings=2048, bos_token_id=tok.token_to_id("<s>"),
                                      eos_token_id=tok.token_to_id("</s>"), tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # as the tests do: well-separated logits, so greedy text is not all one token
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    tmp = directory.with_name(directory.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / MARKER).write_text(json.dumps({"weights": "random", "made_by": "scripts/make_demo_model.py"}) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache" / "strata" / "demo-model"
    print(make(target.expanduser()))
