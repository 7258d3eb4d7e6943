"""Per-client state the engine keeps (`fedlight.engine.client_states`): rows read back as written whether in memory
or spilled to the file, untouched clients cost nothing, the engine stores what clients return and leaves out what is
not finite, and checkpoints (in memory, and a run resumed after a crash) give back exactly the rows they saved."""

import copy
import csv
import json
import math

import pytest
import torch

from fedlight.plugin.algorithm import Algorithm
from fedlight.engine.client_states import ClientStates
from fedlight.engine.config import FederationConfig
from fedlight.plugin import Plan
from fedlight.plugin.round_updates import finite
from fedlight.plugin.updates import Updates
from fedlight.models import SmallCNN
from fedlight.run import checkpoint
from fedlight.run.cli import main

from helpers.federations import every_row, small_federation
from helpers.resume import crash_and_resume

CPU = torch.device("cpu")
ROW = 4 * 4  # bytes of a row of four float32


def store_of(limit: int, folder=None, clients: int = 6, initial=None):
    """A store of `clients` rows of four floats under a memory budget of `limit` bytes (spill files in `folder`)."""
    states = ClientStates(CPU, limit)
    if folder is not None:
        states.use_folder(folder)
    return states, states.declare("v", clients, torch.zeros(4) if initial is None else initial)


def test_untouched_clients_read_the_initial_row_and_nothing_is_stored():
    initial = torch.tensor([1.0, 2.0, 3.0, 4.0])
    _, store = store_of(10 * ROW, initial=initial)
    assert torch.equal(store.read([0, 5, 5]), initial.expand(3, 4))
    assert torch.equal(store[2], initial)
    assert store.memory_bytes == store.stored_bytes == store.spilled_rows == 0
    assert store.touched().tolist() == []
    states = ClientStates(CPU, 10 * ROW)
    by_client = states.declare("c", 4, lambda clients: clients[:, None].float().expand(-1, 3))  # row c: (c, c, c)
    assert by_client.row_shape == (3,) and torch.equal(by_client.read([3, 1]), torch.tensor([[3.0] * 3, [1.0] * 3]))


def test_rows_read_back_as_written_in_any_order_beside_untouched_ones():
    _, store = store_of(10 * ROW)
    rows = torch.arange(12.0).reshape(3, 4)
    store.write(torch.tensor([4, 1, 2]), rows)
    assert torch.equal(store.read([2, 0, 4, 1]), torch.stack([rows[2], torch.zeros(4), rows[0], rows[1]]))
    store.write([1], -rows[:1])  # written again: replaced
    assert torch.equal(store[1], -rows[0])
    assert store.touched().tolist() == [1, 2, 4]
    assert store.memory_bytes == store.stored_bytes == 3 * ROW and store.spilled_rows == 0
    copy_ = store[4]
    copy_ += 100  # a read is a copy: writing into it leaves the store alone
    assert torch.equal(store[4], rows[0])


def test_rows_beyond_the_budget_spill_to_the_file_and_read_back_exactly(tmp_path):
    states, store = store_of(int(2.5 * ROW), tmp_path)
    rows = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    store.write([0, 1, 2, 3, 4], rows)
    assert store.memory_bytes == 2 * ROW and store.spilled_rows == 3 and store.stored_bytes == 5 * ROW
    assert [p.name for p in tmp_path.iterdir()] == ["v.0.rows"]
    assert torch.equal(store.read([4, 0, 5, 3]), torch.stack([rows[4], rows[0], torch.zeros(4), rows[3]]))
    states.checkpointed()
    store.write([3, 1], rows[:2] * 2)  # a spilled row and a row in memory, written again after a checkpoint
    assert torch.equal(store.read(range(5)), torch.stack([rows[0], rows[1] * 2, rows[2], rows[0] * 2, rows[4]]))
    assert store.memory_bytes == 2 * ROW and store.spilled_rows == 3  # a row stays where it was first stored


def test_every_dtype_and_row_shape_survives_the_file(tmp_path):
    states = ClientStates(CPU, 0)
    states.use_folder(tmp_path)
    alpha = states.declare("alpha", 3, torch.tensor(0.5))  # one number a client (APFL's alpha)
    counts = states.declare("counts", 3, torch.zeros(2, 2, dtype=torch.long))
    half = states.declare("half", 3, torch.zeros(3, dtype=torch.bfloat16))
    alpha.write([2], torch.tensor([0.25]))
    counts.write([0, 1], torch.tensor([[[1, 2], [3, 4]], [[-5, 6], [7, 2**40]]]))
    half.write([1], torch.tensor([[1.5, -2.25, 3e4]], dtype=torch.bfloat16))
    assert alpha.read(range(3)).tolist() == [0.5, 0.5, 0.25]
    assert counts[1].tolist() == [[-5, 6], [7, 2**40]] and counts[2].tolist() == [[0, 0], [0, 0]]
    assert half[1].tolist() == torch.tensor([1.5, -2.25, 3e4], dtype=torch.bfloat16).tolist()
    assert (alpha.spilled_rows, counts.spilled_rows, half.spilled_rows) == (1, 2, 1) and half.memory_bytes == 0


def test_memory_grows_with_the_clients_written_not_with_every_client():
    states = ClientStates(CPU, 1 << 30)
    store = states.declare("personal", 3400, torch.zeros(1_000_000))
    store.write(list(range(0, 3400, 340)), torch.ones(10, 1_000_000))
    row = 4 * 1_000_000
    assert store.memory_bytes == store.stored_bytes == 10 * row and states.budget.used == 10 * row
    assert store.spilled_rows == 0
    assert torch.equal(store[3399], torch.zeros(1_000_000)) and torch.equal(store[340], torch.ones(1_000_000))


def test_a_kept_checkpoint_reads_back_its_rows_however_later_rounds_wrote_the_file(tmp_path):
    """The runner keeps the last two checkpoints and a crash may come after the next round wrote its rows: both
    must still restore exactly what they saved, into a fresh store reading the same file."""
    states, store = store_of(int(1.5 * ROW), tmp_path)
    generator = torch.Generator().manual_seed(0)
    kept: list[tuple[dict, torch.Tensor]] = []
    for _ in range(12):
        clients = torch.randperm(6, generator=generator)[:3]
        store.write(clients, torch.randn(3, 4, generator=generator))
        store.write(clients[:1], torch.randn(1, 4, generator=generator))  # again before the checkpoint
        for state, expected in kept[-2:]:  # the next round's rows are in the file, its checkpoint not yet taken
            _, fresh = store_of(int(1.5 * ROW), tmp_path)
            fresh.load_state_dict(state)
            assert torch.equal(every_row(fresh), expected)
        kept.append((copy.deepcopy(states.state_dict()["v"]), every_row(store)))
        states.checkpointed()
    assert store.spilled_rows == 5
    assert (tmp_path / "v.0.rows").stat().st_size <= 16 * ROW  # freed slots are reused: 12 rounds, 48 writes


def test_without_checkpoints_a_spilled_row_is_rewritten_in_place(tmp_path):
    _, store = store_of(0, tmp_path)
    for value in range(100):
        store.write([3], torch.full((1, 4), float(value)))
    assert torch.equal(store[3], torch.full((4,), 99.0))
    assert (tmp_path / "v.0.rows").stat().st_size <= 8 * ROW


def test_bad_declarations_and_writes_are_refused_in_one_line():
    states = ClientStates(CPU, 100)
    store = states.declare("v", 3, torch.zeros(4))
    with pytest.raises(ValueError, match="declared twice"):
        states.declare("v", 3, torch.zeros(4))
    with pytest.raises(ValueError, match="names a file"):
        states.declare("a/b", 3, torch.zeros(4))
    with pytest.raises(ValueError, match=r"one row of shape \(4,\) per client"):
        store.write([0, 1], torch.zeros(2, 5))
    with pytest.raises(IndexError, match="not among the 3 clients"):
        store.read([3])
    with pytest.raises(ValueError, match="client_state_memory must be above 0"):
        FederationConfig(client_state_memory=0)


def test_the_folder_of_the_spill_files_is_chosen_before_a_row_spills(tmp_path):
    states, store = store_of(0)  # a temporary folder, made by the first spill
    store.write([0], torch.ones(1, 4))
    with pytest.raises(RuntimeError, match="before the run chose their folder"):
        states.use_folder(tmp_path)


class Noted(Algorithm):
    """FedAvg whose clients send a note beside their model (the client state "note"); client `bad` sends NaN."""

    plan = Plan(own_training=True)

    def __init__(self, bad: int, participation: float = 1.0) -> None:
        super().__init__(participation)
        self.bad = bad

    def setup(self, server) -> None:
        super().setup(server)
        self.notes = server.state.declare("note", initial=torch.zeros(2))

    def train_client(self, round, client, start):
        trained, loss = super().train_client(round, client, start)
        note = torch.tensor([float(client), math.nan if client == self.bad else float(round)])
        return trained, loss, {"note": note}


def test_the_engine_stores_returned_state_and_leaves_out_a_client_whose_state_is_not_finite():
    fed = small_federation(Noted(bad=2), num_clients=4, rounds=1)
    server = fed.server
    result = fed.run_round(1)
    assert result.left_out == [2]
    notes = fed.algorithm.notes
    assert notes.touched().tolist() == [0, 1, 3]
    assert torch.equal(every_row(notes), torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [3.0, 1.0]]))
    kept = [0, 1, 3]  # FedAvg over the other clients, each trained alone from the initial model
    trained = torch.stack([server.clients.train(1, c, server.model.initial_params).params for c in kept]).double()
    sizes = server.clients.train_sizes[kept].double()
    expected = (sizes[:, None] * trained).sum(0) / sizes.sum()
    assert torch.allclose(fed.algorithm.models[0].double(), expected, atol=1e-6)


def test_finite_checks_every_returned_row_whatever_its_shape():
    params = torch.zeros(3, 2)
    state = {"alpha": torch.tensor([0.5, math.inf, 0.5]), "rows": torch.zeros(3, 2, 2)}
    state["rows"][0, 1, 0] = math.nan
    left_out: list[int] = []
    kept = finite(
        Updates(torch.tensor([4, 5, 6]), params, params, torch.ones(3), torch.zeros(3), state=state), left_out
    )
    assert left_out == [4, 5] and kept.clients.tolist() == [6] and kept.state["alpha"].tolist() == [0.5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_rows_tells_huge_finite_entries_from_nan_and_infinity(dtype):
    from fedlight.plugin.round_updates import finite_rows

    big = torch.finfo(dtype).max
    rows = torch.zeros(5, 4, dtype=dtype)
    rows[1, :] = big  # finite entries whose sum overflows: still finite
    rows[2, 3] = math.nan
    rows[3, 0], rows[3, 1] = math.inf, -math.inf  # a sum of NaN
    rows[4, 2] = -math.inf
    assert finite_rows(rows).tolist() == [True, True, False, False, False]
    assert finite_rows(rows[[0, 1]]).tolist() == [True, True]


def test_a_federation_state_restores_every_store_exactly():
    def make():
        return small_federation(Noted(bad=-1, participation=0.5), num_clients=4, rounds=3)

    a = make()
    for r in (1, 2):
        a.run_round(r)
    b = make()
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert torch.equal(every_row(b.algorithm.notes), every_row(a.algorithm.notes))
    assert torch.equal(b.algorithm.notes.touched(), a.algorithm.notes.touched())
    a.run_round(3), b.run_round(3)
    assert torch.equal(every_row(b.algorithm.notes), every_row(a.algorithm.notes))
    assert torch.equal(a.algorithm.models, b.algorithm.models)
    older = {k: v for k, v in a.state_dict().items() if k != "client_state"}  # format 3: rows were the algorithm's
    with pytest.raises(ValueError, match="no client state .* start the run again"):
        make().load_state_dict(older)


def rows(path):
    with path.open() as f:
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in csv.DictReader(f)]


def drop_last_checkpoint(run_dir):
    (run_dir / "checkpoints" / checkpoint.LAST).unlink()  # a crash between renaming the two: previous is read


@pytest.mark.parametrize(
    "algorithm, store", [(["--algorithm", "ditto"], "personal"), (["--algorithm", "scaffold"], "client_controls")]
)
@pytest.mark.parametrize("before_resuming", [None, drop_last_checkpoint], ids=["from last", "from previous"])
def test_a_run_that_spills_and_crashes_after_writing_resumes_to_the_uninterrupted_numbers(
    tmp_path, tiny_run_args, monkeypatch, algorithm, store, before_resuming
):
    row_bytes = 4 * sum(t.numel() for t in SmallCNN(1, 10, 8, width=8).state_dict().values())
    args = (
        tiny_run_args
        + algorithm
        + [
            "--algorithm.init_args.participation",
            "0.5",
            "--federation.rounds",
            "5",
            "--federation.client_state_memory",
            str(3.5 * row_bytes / 1e9),
        ]
    )
    assert main(args + ["--run_name", "whole"]) == 0  # the budget holds one round's 3 rows (a smaller one is refused)
    saved = checkpoint.read(tmp_path / "whole" / "checkpoints" / checkpoint.LAST)["federation"]["client_state"][store]
    assert len(saved["memory_clients"]) == 3 and len(saved["file_clients"]) >= 2  # rows in memory and in the file
    crashed = tmp_path / "crashed"
    crash_and_resume(args, crashed, monkeypatch, crash_round=4, after_the_work=True, before_resuming=before_resuming)
    whole = tmp_path / "whole"
    for table in ("metrics.csv", "clients.csv"):
        assert rows(crashed / table) == rows(whole / table), table
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, crashed))
    assert {k: v for k, v in a.items() if k not in ("wall_time_s", "run")} == {
        k: v for k, v in b.items() if k not in ("wall_time_s", "run")
    }
