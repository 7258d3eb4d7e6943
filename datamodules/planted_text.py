"""Generated text with planted structure, for trying and testing the pretrained configs without a download:

    python -m fedlight.datamodules.planted_text --out data/planted_text.jsonl

Each row is {"text", "label", "topic", "category", "instruction", "response"}: a sentence of filler words with
`keywords` words of its topic's own vocabulary. In category 0 a row's label is its topic; in category 1 the labels are
swapped in pairs (topic 0 is labelled 1, topic 1 is labelled 0, ...), so the two categories need different classifiers:
partitioned by category (`partition: Groups`, `group_column: category`) the clients fall into two true clusters that a
clustered method can find only by what the clients' models learn, as the label-swap benchmark of IFCA and CFL.
Partitioned any other way, `LabelPermutations` plants the same swap per client instead. For instruction tuning
(`InstructionFederated`, with `input_column: text`) the instruction asks for the label and the response is its word,
`label<label>`: the same two groups, told apart by which word follows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def planted_rows(
    samples: int = 2000,
    topics: int = 4,
    categories: int = 2,
    keywords: int = 4,
    length: int = 8,
    vocabulary: int = 40,
    seed: int = 0,
) -> list[dict]:
    """`samples` rows as the module docstring describes; topic words are `t<topic>_<i>`, filler words `w<i>`."""
    if topics % 2:
        raise ValueError(f"topics must be even (labels are swapped in pairs), got {topics}")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(samples):
        topic, category = int(rng.integers(topics)), int(rng.integers(categories))
        words = [f"w{i}" for i in rng.integers(vocabulary, size=length - keywords)]
        for word in rng.integers(vocabulary // 4, size=keywords):
            words.insert(int(rng.integers(len(words) + 1)), f"t{topic}_{word}")
        label = topic if category % 2 == 0 else topic ^ 1
        rows.append(
            {
                "text": " ".join(words),
                "label": label,
                "topic": topic,
                "category": f"c{category}",
                "instruction": "Name the label of the text.",
                "response": f"label{label}",
            }
        )
    return rows


def write_planted(out: Path, **settings) -> Path:
    """Write `planted_rows(**settings)` to `out` as jsonl; returns `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for row in planted_rows(**settings):
            f.write(json.dumps(row) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m fedlight.datamodules.planted_text`: write `--samples` rows of planted text to `--out`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--categories", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    write_planted(a.out, samples=a.samples, topics=a.topics, categories=a.categories, seed=a.seed)
    print(f"wrote {a.samples} rows to {a.out}")


if __name__ == "__main__":
    main()
