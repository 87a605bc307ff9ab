"""A tiny causal language model built offline, as a model folder ``save_pretrained``
writes: a byte-level BPE tokenizer trained on a few sentences, with a chat template, and
a two-layer Llama with random weights. It proves the plumbing, not the prose: greedy
decoding is deterministic, so what the door answers can be held to ``generate``."""

from __future__ import annotations

import os
from pathlib import Path

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A cat sits on the mat and looks at the bird.",
    "Shipyard serves models behind the SageMaker API.",
    "Tokens stream one at a time to the client.",
    "The ocean is deep and the sky is wide.",
    "Hello! How are you today? I am fine, thank you.",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|end|>", "<|pad|>", "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>"]


def build(folder: Path, *, context: int = 96, seed: int = 7) -> Path:
    """Write the model folder (once: an existing one is kept) and return it."""
    if (folder / "config.json").is_file():
        return folder
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    # Characters, not bytes: any sequence of tokens decodes to valid text.
    tokenizer = Tokenizer(models.BPE(unk_token="<|unk|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIAL)
    tokenizer.train_from_iterator(SENTENCES * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|end|>",
        pad_token="<|pad|>",
        unk_token="<|unk|>",
        model_max_length=context,
    )
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=context,
        # Large random weights make the logits far apart: greedy decoding then picks
        # the same token padded in a batch or alone.
        initializer_range=0.5,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder
