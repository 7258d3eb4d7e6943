"""Per-client state at cross-device scale (`fedlight.engine.client_states`): what a store holds, in memory and in its
file, follows the clients written, never the clients there are; a row paged out to the file comes back bit for bit;
a run of 2,000 clients whose rows spill resumes after a crash to the numbers of an uninterrupted run."""

import copy
import csv
import json

import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.algorithms.scaffold import SCAFFOLD
from fedlight.models import MLP, Classifier
from fedlight.engine.client_states import ClientStates
from fedlight.run import checkpoint
from fedlight.run.cli import main

from helpers.many_clients import NETWORK, ManyClients, ditto_run_args, row_bytes_of
from helpers.resume import crash_and_resume

CPU = torch.device("cpu")
ROW = 4 * 4  # bytes of a row of four float32
CLIENTS = 10_000


def bits(rows: torch.Tensor) -> torch.Tensor:
    """The float32 rows' bit patterns (NaN payloads and -0.0 included, which torch.equal would not tell apart)."""
    return rows.view(torch.int32)


@pytest.mark.parametrize("seed", range(4))
def test_what_a_store_holds_follows_the_clients_written_whatever_the_writes(seed, tmp_path):
    """Random rounds of random clients among 10,000, rewrites and checkpoints mixed in, under a random budget: after
    every round the store holds exactly the touched clients' rows (the first ones written in memory while the budget
    allows, the rest in the file), each reads back as last written and every other client reads the initial row."""
    generator = torch.Generator().manual_seed(seed)

    def draw(high: int) -> int:
        return int(torch.randint(high, (1,), generator=generator))

    budget_rows = draw(12)
    initial = torch.randn(4, generator=generator)
    states = ClientStates(CPU, budget_rows * ROW + 3)  # a budget that is no whole number of rows
    states.use_folder(tmp_path)
    store = states.declare("v", CLIENTS, initial)
    written: dict[int, torch.Tensor] = {}
    for _ in range(12):
        clients = torch.randperm(CLIENTS, generator=generator)[: 1 + draw(8)].tolist()
        if written and draw(2):  # some clients of earlier rounds again
            clients += [list(written)[draw(len(written))]]
            clients = list(dict.fromkeys(clients))
        rows = torch.randint(-(2**31), 2**31 - 1, (len(clients), 4), dtype=torch.int32, generator=generator)
        store.write(clients, rows.view(torch.float32))  # any bit pattern: NaN payloads, infinities, subnormals
        written.update(zip(clients, rows))
        if draw(2):
            states.checkpointed()
        touched = sorted(written)
        assert store.touched().tolist() == touched
        assert store.stored_bytes == store.memory_bytes + store.spilled_rows * ROW == len(touched) * ROW
        assert store.memory_bytes == min(len(touched), budget_rows) * ROW == states.budget.used
        assert torch.equal(bits(store.read(touched)), torch.stack([written[c] for c in touched]))
        others = [c for c in torch.randint(CLIENTS, (64,), generator=generator).tolist() if c not in written]
        assert torch.equal(store.read(others), initial.expand(len(others), 4))


@pytest.mark.filterwarnings("ignore:most clients have fewer than 10")  # one test point a client: no evaluation here
def test_a_federation_of_10000_clients_stores_only_the_rows_of_the_clients_it_trained():
    torch.manual_seed(0)
    model = Classifier(MLP(**NETWORK), lr=0.1)
    row = row_bytes_of(model)
    config = FederationConfig(
        rounds=100,
        eval_every=100,
        clients_per_round=4,
        batch_size=8,
        accelerator="cpu",
        vectorize=4,
        client_state_memory=6.5 * row / 1e9,
    )  # 6 rows in memory
    fed = Federation(ManyClients(CLIENTS), model, SCAFFOLD(), config)
    store = fed.algorithm.client_controls
    trained: set[int] = set()
    for round in range(1, 5):  # no evaluation: 100 rounds are configured
        trained |= set(fed.algorithm.select_clients(round))  # a query: the clients the round trains
        fed.run_round(round)
        assert store.touched().tolist() == sorted(trained)
        assert store.memory_bytes == min(len(trained), 6) * row
        assert store.stored_bytes == store.memory_bytes + store.spilled_rows * row == len(trained) * row
    assert store.spilled_rows == len(trained) - 6 > 0
    [file] = fed.client_states.spill_files()
    assert file.stat().st_size <= 2 * max(8, store.spilled_rows) * row  # slots for the spilled rows, grown by doubling
    untouched = [c for c in range(0, CLIENTS, 7) if c not in trained]
    assert torch.equal(store.read(untouched), torch.zeros(len(untouched), row // 4))


def test_a_spilled_row_comes_back_bit_for_bit_through_grown_files_and_a_fresh_mapping(tmp_path):
    """Every row in the file (a budget of none), written a few at a time so the file grows and is mapped again
    (8, 16, 32, 64 slots); read back after each write, after a checkpoint and by a fresh store on the same file."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(-(2**31), 2**31 - 1, (40, 4), dtype=torch.int32, generator=generator)
    rows[0] = torch.tensor([0x80000000 - 2**32, 0x7FC00001, 0x7F800001, 0x00000001])  # -0.0, NaN payloads, subnormal
    halves = torch.randint(-(2**15), 2**15 - 1, (40, 3), dtype=torch.int16, generator=generator)
    states = ClientStates(CPU, 0)
    states.use_folder(tmp_path)
    store = states.declare("v", 100, torch.zeros(4))
    half = states.declare("half", 100, torch.zeros(3, dtype=torch.bfloat16))
    clients = torch.randperm(100, generator=generator)[:40]
    for begin in range(0, 40, 3):
        store.write(clients[begin : begin + 3], rows[begin : begin + 3].view(torch.float32))
        half.write(clients[begin : begin + 3], halves[begin : begin + 3].view(torch.bfloat16))
        assert torch.equal(bits(store.read(clients[: begin + 3])), rows[: begin + 3])
    assert store.spilled_rows == half.spilled_rows == 40 and store.memory_bytes == 0
    states.checkpointed()
    saved = copy.deepcopy(states.state_dict())
    fresh = ClientStates(CPU, 0)
    fresh.use_folder(tmp_path)
    fresh.declare("v", 100, torch.zeros(4))
    fresh.declare("half", 100, torch.zeros(3, dtype=torch.bfloat16))
    fresh.load_state_dict(saved)
    for states_ in (states, fresh):
        assert torch.equal(bits(states_.stores["v"].read(clients)), rows)
        assert torch.equal(states_.stores["half"].read(clients).view(torch.int16), halves)


def rows_of(path):
    with path.open() as f:
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in csv.DictReader(f)]


def test_a_run_of_2000_clients_whose_rows_spill_resumes_to_the_uninterrupted_numbers(tmp_path, monkeypatch):
    """Ditto, 5 of 2,000 clients a round, 7 rows in memory: the crash comes after round 3 wrote its rows to the file,
    and every client's personal model (the spilled ones read back from the file) is evaluated in the last round."""
    args = ditto_run_args(tmp_path, clients=2000, per_round=5, rounds=4, memory_rows=7.5) + [
        "--federation.eval_every",
        "4",
    ]
    assert main(args + ["--run_name", "whole"]) == 0
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    saved = checkpoint.read(whole / "checkpoints" / checkpoint.LAST)["federation"]["client_state"]["personal"]
    assert len(saved["memory_clients"]) == 7 and len(saved["file_clients"]) >= 10
    crash_and_resume(args, crashed, monkeypatch, crash_round=3, after_the_work=True)
    for table in ("metrics.csv", "clients.csv"):
        assert rows_of(crashed / table) == rows_of(whole / table), table
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, crashed))
    assert {k: v for k, v in a.items() if k not in ("wall_time_s", "run")} == {
        k: v for k, v in b.items() if k not in ("wall_time_s", "run")
    }
