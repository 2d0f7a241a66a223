"""Offline tokenizers trained with `tokenizers` on a fixed corpus (deterministic).

Writes tokenizer.json + tokenizer_config.json directly, so building needs only the
`tokenizers` package (shipped with vLLM's dependencies), not transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "vLLM serves large language models with paged attention and continuous batching.",
    "Operators start engines, look inside them and prove failure modes are handled.",
    "Shared memory tables live in /dev/shm and are mapped by every replica process.",
    "A key value cache block can fail to load; the scheduler recomputes the request.",
    "Batch invariance means the same prompt gives the same tokens alone or batched.",
    "Hello world! How are you today? I am fine, thank you very much.",
    "Once upon a time there was a small model that lived on a CPU with two cores.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in logs and metrics.",
    "The cat sat on the mat, and the dog slept in the sun near the river bank.",
    "Search engines rank documents by relevance to a query using cross encoders.",
    "Images are described by captions: a red square, a blue circle, a green line.",
]

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def write_bpe_tokenizer(
    out: Path, vocab_size: int = 320, extra_specials: list[str] | None = None
) -> int:
    """Train a byte-level BPE tokenizer and save it; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = SPECIALS + list(extra_specials or [])
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    if extra_specials:
        config["additional_special_tokens"] = list(extra_specials)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
            indent=2,
        )
        + "\n"
    )
    return tok.get_vocab_size()


def token_id(out: Path, token: str) -> int:
    """The id of ``token`` in the tokenizer written to ``out``; KeyError when absent."""
    from tokenizers import Tokenizer

    tid = Tokenizer.from_file(str(out / "tokenizer.json")).token_to_id(token)
    if tid is None:
        raise KeyError(token)
    return int(tid)
