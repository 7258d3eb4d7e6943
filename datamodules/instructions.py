"""Instructions and their responses from a local file (jsonl, csv or a `datasets` folder), for instruction tuning a
causal language model (`fedlight.models.PretrainedCausalLM`).

Each row's prompt is written with Alpaca's template (its preamble sentence left out: "### Instruction:", the
instruction, "### Input:" and the input when the row has one, "### Response:"), tokenized with the model's own
tokenizer, and followed by the response's tokens and the end-of-sequence token. A sample is then (token ids, labels),
both (max_length,): the ids padded with the pad id, and the labels the ids at response positions and -100 at the
prompt's and padding's (set by position, so a pad id equal to the end-of-sequence id still leaves the final token
counted). Rows whose response the length cuts off entirely are left out, with a warning naming max_length.

A row has no class label, so the partitions that read labels (Dirichlet, ClassesPerClient, label permutations)
are refused; clients are cut IID, by quantity, by their natural owners or by a column's groups (`Groups` with
`group_column`: a task, a category, Dolly's or Alpaca-style categories: true clusters). The tokenized rows are cached
beside the data as TextFederated's are.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import FederatedDataModule
from fedlight.datamodules.partition import IID, Groups, Natural, QuantitySkew
from fedlight.datamodules.text import cache_file, cache_key, read_rows
from fedlight.models.pretrained_lm import IGNORE

PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
#: partitions that do not read labels, the ones instruction rows (which have none) can be cut by
LABEL_FREE = (IID, QuantitySkew, Natural, Groups)


def prompt_of(row: dict, instruction: str, input: str | None) -> str:
    """The row's prompt in Alpaca's template (with its input section when the row's input is not empty)."""
    context = str(row.get(input) or "").strip() if input else ""
    if context:
        return PROMPT_WITH_INPUT.format(instruction=row[instruction], input=context)
    return PROMPT.format(instruction=row[instruction])


def sequences(
    prompts: list[list[int]], responses: list[list[int]], max_length: int, pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(ids, labels, kept) of prompt + response token lists cut to `max_length`: ids padded with `pad_id`, labels
    -100 outside the response, `kept` the rows with at least one response token left."""
    ids = torch.full((len(prompts), max_length), pad_id, dtype=torch.long)
    labels = torch.full((len(prompts), max_length), IGNORE, dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        tokens = (prompt + response)[:max_length]
        ids[i, : len(tokens)] = torch.tensor(tokens)
        labels[i, len(prompt) : len(tokens)] = ids[i, len(prompt) : len(tokens)]
    return ids, labels, (labels != IGNORE).any(dim=1)


class InstructionFederated(FederatedDataModule):
    """Instruction rows of a local file, tokenized with the causal model's tokenizer, cut into clients.

    Args:
        path: a .jsonl or .csv file, or a folder `datasets` saved one data set into.
        tokenizer: the folder holding the tokenizer (usually the pretrained model's folder).
        instruction_column, input_column, response_column: the rows' columns (Alpaca: instruction, input, output;
            Dolly: instruction, context, response). input_column None: prompts without an input section.
        group_column: the column of the rows' natural groups (Dolly's `category`), for the `Groups` partition.
        max_length: tokens kept per sample (prompt and response together).
        num_clients, partition, val_fraction, test_fraction, split_seed, holdout_clients: as in
            FederatedDataModule (partition: IID, QuantitySkew, Natural or Groups).
    """

    def __init__(
        self,
        path: str,
        tokenizer: str,
        instruction_column: str = "instruction",
        input_column: str | None = "input",
        response_column: str = "response",
        group_column: str | None = None,
        max_length: int = 128,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(self.partition, LABEL_FREE):
            raise ValueError(
                f"{type(self.partition).__name__} cuts clients by class labels, which instruction rows "
                "do not have: use IID, QuantitySkew, Natural or Groups (with group_column)"
            )
        if max_length < 2:
            raise ValueError(f"max_length must be at least 2, got {max_length}")
        self.path, self.tokenizer_path = Path(path), Path(tokenizer)
        self.columns = (instruction_column, input_column, response_column)
        self.group_column, self.max_length = group_column, max_length

    @property
    def num_classes(self) -> int:
        """0: a sample has no class label (what is predicted is the response's tokens)."""
        return 0

    def load_pool(self) -> tuple[Tensor, Tensor]:
        instruction, input, response = self.columns
        required = [instruction, response] + ([self.group_column] if self.group_column else [])
        rows = read_rows(self.path, required)
        cache = cache_file(
            self.path,
            cache_key(self.path, self.tokenizer_path, f"{self.columns}|{self.max_length}|{PROMPT_WITH_INPUT}"),
        )
        if cache.is_file():
            ids, labels, kept = torch.load(cache).values()
        else:
            ids, labels, kept = self.tokenize(rows)
            torch.save({"ids": ids, "labels": labels, "kept": kept}, cache)
        if not kept.any():
            raise ValueError(
                f"max_length {self.max_length} cuts every row's response off (its prompt alone is longer): raise it"
            )
        if not kept.all():
            warnings.warn(
                f"{int((~kept).sum())} of {len(rows)} rows left out: max_length {self.max_length} cuts "
                "their response off entirely; raise it to keep them",
                stacklevel=2,
            )
        if self.group_column:
            owners = [str(row[self.group_column]) for row, keep in zip(rows, kept.tolist()) if keep]
            self.pool_owners = np.asarray(owners)
        return ids[kept], labels[kept]

    def tokenize(self, rows: list[dict]) -> tuple[Tensor, Tensor, Tensor]:
        """(ids, labels, kept) of every row (`sequences`), with the model's tokenizer."""
        if not self.tokenizer_path.is_dir():
            raise FileNotFoundError(
                f"tokenizer folder {self.tokenizer_path} not found: give the pretrained model's "
                "folder (its tokenizer's files are saved beside the weights)"
            )
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        if tokenizer.pad_token_id is None:
            raise ValueError(
                f"the tokenizer in {self.tokenizer_path} has no pad token: samples are padded to "
                "max_length, so give it one (the model's config.json pad_token_id)"
            )
        instruction, input, response = self.columns
        prompts = tokenizer([prompt_of(row, instruction, input) for row in rows])["input_ids"]
        end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        answers = [
            ids + end for ids in tokenizer([str(row[response]) for row in rows], add_special_tokens=False)["input_ids"]
        ]
        return sequences(prompts, answers, self.max_length, tokenizer.pad_token_id)
