"""Files in each data family's published on-disk format, with random content: the data-module tests write small
ones (tests/unit/test_data_*.py), benchmarks/paper_configs.py writes them at the published sizes to measure a paper
config's memory. Sample i carries its number in its first two pixels (mod 256 each), so the tests can trace it."""

from __future__ import annotations

import functools
import json
import pickle
import struct

import numpy as np

#: the vision tests' train and test sizes
N_TRAIN, N_TEST = 40, 12
#: the MedMNIST tests' split sizes
MEDMNIST_SIZES = {"train": 60, "val": 12, "test": 18}
#: the UCI tests' row count
N_ROWS = 60
#: the FEMNIST tests' writers -> (train samples, test samples)
WRITERS = {"f0003_12": (8, 2), "f0001_40": (6, 2), "f0002_07": (12, 3), "f0000_01": (3, 1), "f0004_33": (9, 2)}
#: the WISDM tests' (user, activity, records) runs in file order
RUNS = [
    (1, "Walking", 25),
    (1, "Jogging", 12),
    (2, "Walking", 30),
    (2, "Sitting", 5),
    (3, "Upstairs", 22),
    (5, "Standing", 15),
    (5, "Walking", 20),
]
#: malformed WISDM records of the kinds found in the real file (each is skipped)
MALFORMED = [
    "1,Walking,49106062271000,,;",  # missing values
    "1,Walking,,5.0,1.0,2.0;",  # missing timestamp
    "2,Walking,49106062271000,0.1,0.2;",  # missing z
    "3,Upstair,49106062271000,1.0,2.0,3.0;",  # unknown activity
    "5,Walking,49106062271000,NaN,1.0,2.0;",  # not a finite reading
    "5,Walking,49106062271000,1.0,2.0,3.0,4.0;",  # too many values
]


def images(n: int, channels: int, side: int, start: int, seed: int = 0) -> np.ndarray:
    """Random uint8 (n, C, side, side) images whose first two pixels carry the sample number."""
    x = np.random.default_rng(seed + start).integers(0, 256, (n, channels, side, side), dtype=np.uint8)
    ids = np.arange(start, start + n)
    x[:, 0, 0, 0], x[:, 0, 0, 1] = ids % 256, ids // 256 % 256
    return x


def write_idx(path, array: np.ndarray) -> None:
    """The idx format (big-endian dims after a magic of 0, 0, type 0x08 = ubyte, number of dims)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, 8, array.ndim]) + b"".join(struct.pack(">i", d) for d in array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def write_mnist_like(
    root,
    folder: str,
    num_classes: int = 10,
    transpose: bool = False,
    prefix=None,
    sizes: tuple[int, int] = (N_TRAIN, N_TEST),
) -> dict:
    """`<root>/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte` (MNIST, Fashion-MNIST, EMNIST)."""
    out = {}
    for split, n, start in (("train", sizes[0], 0), ("t10k", sizes[1], sizes[0])):
        x = images(n, 1, 28, start)[:, 0]
        y = (np.arange(start, start + n) % num_classes).astype(np.uint8)
        name = prefix(split) if prefix else split
        write_idx(root / folder / "raw" / f"{name}-images-idx3-ubyte", x.transpose(0, 2, 1) if transpose else x)
        write_idx(root / folder / "raw" / f"{name}-labels-idx1-ubyte", y)
        out[split] = (x, y)
    return out


def write_cifar(root, hundred: bool = False, sizes: tuple[int, int] = (N_TRAIN, N_TEST)) -> dict:
    """CIFAR's pickled batches: `cifar-10-batches-py/` (five training batches) or `cifar-100-python/`."""
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True)
    key = "fine_labels" if hundred else "labels"
    classes = 100 if hundred else 10
    names = ["train"] if hundred else [f"data_batch_{i}" for i in range(1, 6)]
    per = sizes[0] // len(names)
    out, start = {}, 0
    for name in names + ["test"]:
        n = sizes[1] if name == "test" else per
        x = images(n, 3, 32, start)
        y = (np.arange(start, start + n) % classes).tolist()
        entry = {"data": x.reshape(n, -1), key: y}
        with open(folder / (name if hundred or name != "test" else "test_batch"), "wb") as f:
            pickle.dump(entry, f)
        out[name] = (x, y)
        start += n
    meta = (
        {"fine_label_names": [f"c{i}" for i in range(100)]}
        if hundred
        else {"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]}
    )
    with open(folder / ("meta" if hundred else "batches.meta"), "wb") as f:
        pickle.dump(meta, f)
    return out


def write_svhn(root, sizes: tuple[int, int] = (N_TRAIN, N_TEST)) -> dict:
    """SVHN's `{train,test}_32x32.mat` (images stored (H, W, C, N), digit 0 labelled 10)."""
    from scipy.io import savemat

    out = {}
    for split, n, start in (("train", sizes[0], 0), ("test", sizes[1], sizes[0])):
        x = images(n, 3, 32, start)
        digits = np.arange(start, start + n) % 10
        savemat(
            root / f"{split}_32x32.mat",
            {
                "X": x.transpose(2, 3, 1, 0),  # SVHN stores (H, W, C, N)
                "y": np.where(digits == 0, 10, digits).reshape(n, 1).astype(np.uint8),
            },
        )
        out[split] = (x, digits)
    return out


def write_medmnist(root, flag: str, num_classes: int, channels: int, size: int = 28, sizes=MEDMNIST_SIZES) -> dict:
    """A `<flag>[_size].npz` in MedMNIST's layout (train/val/test images and (N, 1) labels)."""
    rng = np.random.default_rng(0)
    arrays, start = {}, 0
    for split, n in sizes.items():
        shape = (n, size, size) if channels == 1 else (n, size, size, channels)
        images = rng.integers(0, 256, shape, dtype=np.uint8)
        ids = np.arange(start, start + n)
        images[:, 0, 0, ...] = (ids % 256)[:, None] if channels > 1 else ids % 256
        images[:, 0, 1, ...] = (ids // 256 % 256)[:, None] if channels > 1 else ids // 256 % 256
        arrays[f"{split}_images"] = images
        arrays[f"{split}_labels"] = (ids % num_classes).astype(np.uint8).reshape(n, 1)
        start += n
    root.mkdir(parents=True, exist_ok=True)
    suffix = "" if size == 28 else f"_{size}"
    np.savez_compressed(root / f"{flag}{suffix}.npz", **arrays)
    return arrays


def write_adult(root, n: int = N_ROWS) -> np.ndarray:
    """`adult.data`: no header, ', '-separated, '?' for missing categorical values, a blank last line."""
    rng = np.random.default_rng(0)
    rows, values = [], []
    for i in range(n):
        v = [
            int(rng.integers(17, 90)),
            10000 + 37 * i,
            int(rng.integers(1, 17)),
            int(rng.integers(0, 3) * 5000),
            int(rng.integers(10, 80)),
        ]
        income = ">50K" if i % 3 == 0 else "<=50K"
        work = "?" if i % 7 == 0 else "Private"
        rows.append(
            f"{v[0]}, {work}, {v[1]}, Bachelors, {v[2]}, Never-married, Adm-clerical, Not-in-family, "
            f"White, Male, {v[3]}, 0, {v[4]}, United-States, {income}"
        )
        values.append(v)
    root.mkdir(parents=True, exist_ok=True)
    (root / "adult.data").write_text("\n".join(rows) + "\n\n")
    return np.asarray(values, dtype=np.float64)


def bank_text(n: int = N_ROWS) -> str:
    """`bank-additional-full.csv`: ';'-separated, quoted header and strings."""
    rng = np.random.default_rng(1)
    header = (
        '"age";"job";"marital";"education";"default";"housing";"loan";"contact";"month";"day_of_week";'
        '"duration";"campaign";"pdays";"previous";"poutcome";"emp.var.rate";"cons.price.idx";"cons.conf.idx";'
        '"euribor3m";"nr.employed";"y"'
    )
    rows = [header]
    for i in range(n):
        rows.append(
            f'{int(rng.integers(18, 90))};"housemaid";"married";"basic.4y";"no";"no";"no";"telephone";'
            f'"may";"mon";{100 + 7 * i};{int(rng.integers(1, 10))};999;0;"nonexistent";1.1;'
            f"{rng.uniform(92, 95):.3f};-36.4;{rng.uniform(0.6, 5):.3f};{rng.choice([5191, 5228.1, 4963.6])};"
            f'"{"yes" if i % 4 == 0 else "no"}"'
        )
    return "\n".join(rows) + "\n"


@functools.cache
def _pixel_tokens(separator: str) -> tuple[np.ndarray, np.ndarray]:
    """The JSON text of k/255 as json.dumps writes it, then `separator`, for k = 0..255: (256, width) bytes
    padded with zeros, and each one's length."""
    texts = [(json.dumps(k / 255) + separator).encode() for k in range(256)]
    table = np.zeros((256, max(map(len, texts))), dtype=np.uint8)
    for k, text in enumerate(texts):
        table[k, : len(text)] = np.frombuffer(text, np.uint8)
    return table, np.array([len(t) for t in texts])


def leaf_pixels_json(pixels: np.ndarray) -> bytes:
    """uint8 rows (n, d) as LEAF's JSON list of rows of k/255, the text json.dumps writes, built by numpy
    (json.dumps of FEMNIST's 805,263 images would take many minutes)."""
    n, d = pixels.shape
    if n == 0:
        return b"[]"
    inner, inner_length = _pixel_tokens(", ")
    last, last_length = _pixel_tokens("], [")  # a row's last value closes it and opens the next
    text = np.zeros((n, d, last.shape[1]), dtype=np.uint8)
    text[:, :-1, : inner.shape[1]] = inner[pixels[:, :-1]]
    text[:, -1] = last[pixels[:, -1]]
    length = np.concatenate([inner_length[pixels[:, :-1]], last_length[pixels[:, -1:]]], axis=1)
    body = text[np.arange(text.shape[2]) < length[..., None]].tobytes()
    return b"[[" + body[: -len(b", [")] + b"]"


def write_leaf(
    root, folders=("train", "test"), writers=WRITERS, files: int = 2, ink: float | None = None
) -> dict[str, list[int]]:
    """LEAF's FEMNIST layout: per folder `files` JSON files, each with some writers (LEAF's hold about 100).
    Pixels are k/255, uniform over k, or with `ink` that share of them random and the rest white (1.0, as LEAF's
    background); sample number s (global) is written into the first two pixels; returns each writer's sample
    numbers per folder."""
    rng = np.random.default_rng(0)
    numbers: dict[str, list[int]] = {}
    counter = 0
    for f, folder in enumerate(folders):
        (root / folder).mkdir(parents=True)
        names = sorted(writers)
        for part, chunk in enumerate(names[i::files] for i in range(files)):
            sizes = [writers[w][f] if len(folders) == 2 else sum(writers[w]) for w in chunk]
            with open(root / folder / f"all_data_{part}_niid_0_keep_0_{folder}_9.json", "wb") as out:
                out.write(
                    f'{{"users": {json.dumps(chunk)}, "num_samples": {json.dumps(sizes)}, "user_data": {{'.encode()
                )
                for j, (w, n) in enumerate(zip(chunk, sizes)):
                    if ink is None:
                        pixels = rng.integers(0, 256, (n, 784))
                    else:
                        pixels = np.where(rng.random((n, 784)) < ink, rng.integers(0, 255, (n, 784)), 255)
                    ids = np.arange(counter, counter + n)
                    pixels[:, 0], pixels[:, 1] = ids % 256, ids // 256 % 256
                    counter += n
                    numbers.setdefault(f"{folder}:{w}", []).extend(ids.tolist())
                    labels = json.dumps(rng.integers(0, 62, n).tolist())
                    out.write(
                        f'{", " if j else ""}{json.dumps(w)}: {{"x": '.encode()
                        + leaf_pixels_json(pixels.astype(np.uint8))
                        + f', "y": {labels}}}'.encode()
                    )
                out.write(b"}}")
    return numbers


def wisdm_record(run: int, index: int, user: int, activity: str, z: float) -> str:
    """x = run number, y = global record number, so windows are traceable; z is noise."""
    return f"{user},{activity},{49105962326000 + 50_000_000 * index},{run},{index},{z:.6f}"


def write_wisdm(root, runs=RUNS) -> str:
    """WISDM's raw file: one record per line ending in ';', with malformed lines, several records on one line,
    trailing commas and blank lines mixed in, as in the real file."""
    rng = np.random.default_rng(0)
    lines, index, bad = [], 0, iter(MALFORMED)
    for run, (user, activity, n) in enumerate(runs):
        k = 0
        while k < n:
            if k == 3 and n - k >= 2:  # several records on one line
                lines.append(
                    wisdm_record(run, index, user, activity, rng.normal())
                    + ";"
                    + wisdm_record(run, index + 1, user, activity, rng.normal())
                    + ";"
                )
                index, k = index + 2, k + 2
                continue
            text = wisdm_record(run, index, user, activity, rng.normal())
            lines.append(text + (",;" if k == 5 else ";"))  # a trailing comma
            index, k = index + 1, k + 1
            if k == 7:
                lines.append(next(bad, ""))  # a malformed record inside the run, or a blank line
    from fedlight.datamodules.wisdm import FILE

    root.mkdir(parents=True, exist_ok=True)
    (root / FILE).write_text("\n".join(lines) + "\n")
    return "\n".join(lines)
