"""Build a tiny causal language model on this machine, offline, as a model folder
``save_pretrained`` writes: a character-level BPE tokenizer trained on a few sentences,
with a chat template, and a two-layer Llama with random weights. Nothing is downloaded.

    pip install 'shipyard[llm]'     # torch and transformers
    HF_HUB_OFFLINE=1 python examples/tiny-lm/build.py            # examples/tiny-lm/model
    HF_HUB_OFFLINE=1 python examples/tiny-lm/build.py /srv/tiny  # or where you say

Serve the folder with ``SHIPYARD_TASK=text-generation`` (see the OpenAI door's guide).
Its weights are random, so it answers with fragments of its six sentences: it shows the
plumbing (chat, streaming, batching, usage), not prose. Greedy decoding is deterministic,
so the tests hold what the door answers to ``generate``.
"""

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


if __name__ == "__main__":
    import sys

    here = Path(__file__).resolve().parent
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else here / "model"
    print(build(target.absolute()))
