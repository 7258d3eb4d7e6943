"""Writes a tiny, randomly initialized "pretrained" model folder, so the pretrained configs run without a download:

    python -m fedlight.models.tiny_pretrained --kind bert --corpus data/planted_text.jsonl --out pretrained/tiny-bert
    python -m fedlight.models.tiny_pretrained --kind vit --image-size 8 --channels 1 --out pretrained/tiny-vit

Text kinds (bert, gpt2: classifiers; gpt2-lm: a causal language model) get a word-level tokenizer built from the
corpus's words (a jsonl or csv file with a `text` column; for gpt2-lm also its instruction, input and response columns
and the prompt template's words), saved beside the model, with [PAD] as id 0 (the model's pad id), [CLS] put first in
every sequence (BERT pools it) and, for gpt2-lm, [EOS] ending every response. Image kinds (vit: transformers' ViT;
timm-vit: timm's VisionTransformer) take the images' size and channels. The weights are random: the folder has the
layout of a real one (config.json, model.safetensors, the tokenizer's files) and exercises the same code, not its
accuracy.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import torch

KINDS = ("bert", "gpt2", "gpt2-lm", "vit", "timm-vit")
#: the causal model's weights' standard deviation: its output layer is its (frozen, tied) embeddings, and at GPT-2's
#: 0.02 a random one's logits span too little for adapters to make any token likely
INIT_RANGE = 0.3
#: the columns a causal model's corpus words come from (those a file has)
INSTRUCTION_COLUMNS = ("text", "instruction", "input", "response")
SPECIAL = ["[PAD]", "[UNK]", "[CLS]"]


def corpus_texts(path: Path, columns: tuple[str, ...] = ("text",)) -> list[str]:
    """The values of `columns` (those the rows have) of every row of a jsonl or csv file."""
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus {path} not found: give a .jsonl or .csv file with a {columns[0]!r} column "
            f"(make one with `python -m fedlight.datamodules.planted_text --out {path}`)"
        )
    with path.open(newline="") as f:
        rows = [json.loads(line) for line in f if line.strip()] if path.suffix == ".jsonl" else list(csv.DictReader(f))
    return [str(row[column]) for row in rows for column in columns if column in row]


def save_word_tokenizer(texts: list[str], out: Path, eos: bool = False) -> int:
    """A word-level tokenizer of the words in `texts` (whitespace and punctuation split), saved in `out` (with an
    [EOS] token when `eos`); its size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    splitter = pre_tokenizers.Whitespace()
    words = sorted({word for text in texts for word, _ in splitter.pre_tokenize_str(text)})
    vocab = {token: i for i, token in enumerate(SPECIAL + ["[EOS]"] * eos + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = splitter
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", 2)])
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        **({"eos_token": "[EOS]"} if eos else {}),
    ).save_pretrained(out)
    return len(vocab)


def make_tiny(
    kind: str,
    out: Path,
    corpus: Path | None = None,
    num_classes: int = 2,
    image_size: int = 8,
    channels: int = 1,
    patch_size: int = 2,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    max_length: int = 64,
    seed: int = 0,
) -> Path:
    """Write a tiny random model of `kind` into `out` (see the module docstring); returns `out`."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if kind == "timm-vit":
        import timm
        from timm.models import save_for_hf

        model = timm.create_model(
            "vit_tiny_patch16_224",
            pretrained=False,
            img_size=image_size,
            patch_size=patch_size,
            in_chans=channels,
            embed_dim=hidden,
            depth=layers,
            num_heads=heads,
            num_classes=num_classes,
        )
        save_for_hf(model, str(out))
        return out
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        GPT2Config,
        GPT2ForSequenceClassification,
        GPT2LMHeadModel,
    )
    from transformers import ViTConfig, ViTForImageClassification
    from transformers.utils import logging

    logging.disable_progress_bar()
    labels: dict[str, Any] = {"num_labels": num_classes}  # a config takes it through **kwargs, untyped

    if kind == "vit":
        config = ViTConfig(
            image_size=image_size,
            patch_size=patch_size,
            num_channels=channels,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=2 * hidden,
            **labels,
        )
        ViTForImageClassification(config).save_pretrained(out)
        return out
    if corpus is None:
        raise ValueError(f"--kind {kind} needs --corpus, the text file its tokenizer's words come from")
    if kind == "gpt2-lm":
        from fedlight.datamodules.instructions import PROMPT_WITH_INPUT

        vocab = save_word_tokenizer(corpus_texts(corpus, INSTRUCTION_COLUMNS) + [PROMPT_WITH_INPUT], out, eos=True)
        GPT2LMHeadModel(
            GPT2Config(
                vocab_size=vocab,
                n_embd=hidden,
                n_layer=layers,
                n_head=heads,
                n_positions=max_length,
                pad_token_id=0,
                bos_token_id=2,
                eos_token_id=3,
                initializer_range=INIT_RANGE,
            )
        ).save_pretrained(out)
        return out
    vocab = save_word_tokenizer(corpus_texts(corpus), out)
    if kind == "bert":
        model = BertForSequenceClassification(
            BertConfig(
                vocab_size=vocab,
                hidden_size=hidden,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                intermediate_size=2 * hidden,
                max_position_embeddings=max_length,
                pad_token_id=0,
                **labels,
            )
        )
    else:
        model = GPT2ForSequenceClassification(
            GPT2Config(
                vocab_size=vocab,
                n_embd=hidden,
                n_layer=layers,
                n_head=heads,
                n_positions=max_length,
                pad_token_id=0,
                bos_token_id=2,
                eos_token_id=2,
                **labels,
            )
        )
    model.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m fedlight.models.tiny_pretrained`: write a tiny random model folder of `--kind` to `--out`
    (`make_tiny`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, help="text kinds: the jsonl/csv file whose words make the vocabulary")
    parser.add_argument("--num-classes", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=8)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--patch-size", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    out = make_tiny(
        a.kind,
        a.out,
        a.corpus,
        a.num_classes,
        a.image_size,
        a.channels,
        a.patch_size,
        a.hidden,
        a.layers,
        a.heads,
        a.max_length,
        a.seed,
    )
    print(f"wrote a tiny random {a.kind} model to {out}")


if __name__ == "__main__":
    main()
