"""A round's work grows with its clients, not with all clients: IFCA's and FLIS-DC's choice of a model by loss is made
by the round's clients (every client only in evaluated rounds), a subset's losses are those of the whole matrix, and
what a method must still do on every client is said in its plan line."""

import pytest
import torch
import torch.nn.functional as F

from fedlight.algorithms.fesem import FeSEM
from fedlight.algorithms.flhc import FLHC
from fedlight.algorithms.flis import FlisDC, FlisHC
from fedlight.algorithms.ifca import IFCA
from fedlight.algorithms.pacfl import PACFL
from fedlight.algorithms.fedavg import FedAvg

from helpers.federations import small_federation


def counting_loss_rows(fed) -> list[int]:
    """Record the rows of every loss pass of `fed`'s clients (each model of `losses` runs `sample_loss` on rows)."""
    rows: list[int] = []
    population = fed.server.clients
    sample_loss = population.sample_loss
    population.sample_loss = lambda params, x, y: rows.append(len(x)) or sample_loss(params, x, y)
    return rows


def selections(fed) -> list[list[int]]:
    """Record the clients the engine selects each round (the algorithm may ask for them once more itself)."""
    chosen: list[list[int]] = []
    select, run_round = fed.algorithm.select_clients, fed.run_round

    def recorded(round):
        result = run_round(round)
        chosen.append(select(round))
        return result

    fed.run_round = recorded
    return chosen


def hand_choice(fed, models: torch.Tensor, client: int, split: str) -> int:
    """The model with the lowest mean cross-entropy on one client's split, computed client by client."""
    x, y = fed.data.split(split).client(client)
    return min(range(len(models)), key=lambda k: float(F.cross_entropy(fed.server.model.predict(models[k], x), y)))


def test_a_subset_of_clients_has_the_losses_of_the_whole_matrix_by_hand():
    fed = small_federation(FedAvg(), num_clients=6)
    models = torch.stack([fed.server.model.initial_params, fed.server.model.random_params(1)])
    some = [4, 1]
    losses = fed.server.clients.losses(models, "train", some)
    assert losses.shape == (2, 2)
    for j, client in enumerate(some):
        x, y = fed.data.train.client(client)
        for k in range(2):
            assert float(losses[k, j]) == pytest.approx(
                float(F.cross_entropy(fed.server.model.predict(models[k], x), y)), rel=1e-5
            )
    assert torch.allclose(losses, fed.server.clients.losses(models, "train")[:, some])


def test_evaluated_rounds_are_every_eval_every_and_the_last():
    fed = small_federation(FedAvg(), num_clients=2, rounds=7, eval_every=3)
    assert [r for r in range(1, 8) if fed.server.run.evaluates(r)] == [3, 6, 7]


@pytest.mark.filterwarnings("ignore:most clients have fewer than 10")  # 200 clients of 1,797 digits
def test_ifca_computes_losses_only_for_the_rounds_clients_until_it_evaluates():
    """200 clients, 5 a round: in rounds 1-2 (not evaluated) the loss passes cover exactly the 5 selected clients'
    training rows under each of the k models, the selected clients pick by hand-computed loss under the models they
    receive, and every other client keeps its cluster; round 3 is evaluated and every client picks."""
    k, n = 3, 200
    fed = small_federation(IFCA(num_clusters=k), num_clients=n, rounds=3, eval_every=3, clients_per_round=5)
    alg, sizes = fed.algorithm, fed.data.train.sizes()
    rows, chosen = counting_loss_rows(fed), selections(fed)
    for round in (1, 2):
        before, received = alg.assignment.clone(), alg.models.clone()
        rows.clear()
        fed.run_round(round)
        clients = chosen[-1]
        assert sum(rows) == k * int(sizes[clients].sum())  # not k * every client's rows: 10 of 200 clients
        assert alg.assignment[clients].tolist() == [hand_choice(fed, received, c, "train") for c in clients]
        others = torch.ones(n, dtype=torch.bool)
        others[clients] = False
        assert torch.equal(alg.assignment[others], before[others])
    rows.clear()
    result = fed.run_round(3)
    assert sum(rows) == k * int(sizes[chosen[-1]].sum()) + k * int(sizes.sum())  # the round's, then everyone's
    everyone = fed.server.clients.losses(alg.models, "train").argmin(dim=0)
    assert torch.equal(alg.assignment, everyone) and result.per_client["cluster"].tolist() == everyone.tolist()


def test_ifca_with_every_client_each_round_reassigns_after_aggregation_with_one_pass_a_round():
    """Every client every round, evaluated every round: the round's pick is the last round's evaluation pick (the
    models did not change in between), so it is not made twice: one pass over the training rows per model a round."""
    fed = small_federation(IFCA(num_clusters=2), num_clients=6, rounds=3)
    alg, total = fed.algorithm, int(fed.data.train.sizes().sum())
    rows = counting_loss_rows(fed)
    for round in (1, 2, 3):
        rows.clear()
        fed.run_round(round)
        assert sum(rows) == (2 if round == 1 else 1) * 2 * total  # round 1 also picks under the initial models
        assert torch.equal(alg.assignment, fed.server.clients.losses(alg.models, "train").argmin(dim=0))


def test_ifca_recovers_the_rotations_with_a_cohort_a_round():
    """Planted rotation clusters recovered with 10 of 20 clients a round, evaluated only at the end (found from
    round 8 on; the run has 10)."""
    from sklearn.metrics import adjusted_rand_score

    fed = small_federation(
        IFCA(num_clusters=2),
        num_clients=20,
        rounds=10,
        eval_every=10,
        clients_per_round=10,
        lr=0.05,
        momentum=0.9,
        local_epochs=2,
        batch_size=16,
    )
    for round in range(1, 11):
        result = fed.run_round(round)
    assert adjusted_rand_score(fed.data.cluster_labels, result.per_client["cluster"]) == 1.0


@pytest.mark.filterwarnings("ignore:most clients have fewer than 10")
@pytest.mark.parametrize("evaluate", ["local", "pool"])
def test_flis_dc_picks_pool_models_only_for_the_rounds_clients_until_it_evaluates(evaluate):
    """40 clients, 4 a round: rounds 2-3 pick (by hand-computed validation loss) for the round's clients alone; round
    4 is evaluated and every client evaluated with a pool model picks one: all of them ("pool"), or those that have
    not trained yet ("local", whose trained clients are evaluated with their own models). One loss pass for each
    distinct pool model: participants with the same similar peers share one."""
    n = 40
    fed = small_federation(
        FlisDC(evaluate=evaluate), num_clients=n, rounds=4, eval_every=4, clients_per_round=4, public_size=60
    )
    alg, sizes = fed.algorithm, fed.data.val.sizes()
    rows, chosen = counting_loss_rows(fed), selections(fed)
    fed.run_round(1)
    assert rows == []  # round 1's pool is the one initial model: nothing to choose
    for round in (2, 3):
        before, pool = alg.assignment.clone(), alg.models.clone()
        rows.clear()
        fed.run_round(round)
        clients = chosen[-1]
        assert sum(rows) == distinct(pool) * int(sizes[clients].sum())
        assert alg.assignment[clients].tolist() == [hand_choice(fed, pool, c, "val") for c in clients]
        others = torch.ones(n, dtype=torch.bool)
        others[clients] = False
        assert torch.equal(alg.assignment[others], before[others])
    rows.clear()
    pool = alg.models.clone()
    fed.run_round(4)
    trained = sorted({c for cohort in chosen for c in cohort})
    picked = list(range(n)) if evaluate == "pool" else [c for c in range(n) if c not in trained]
    assert sum(rows) == distinct(pool) * int(sizes[chosen[-1]].sum()) + distinct(alg.models) * int(sizes[picked].sum())
    assert alg.assignment[picked].tolist() == [hand_choice(fed, alg.models, c, "val") for c in picked]


def distinct(models: torch.Tensor) -> int:
    return len(torch.unique(models, dim=0))


def test_flis_dc_makes_one_loss_pass_for_each_distinct_pool_model_and_picks_the_first_of_equals():
    """A pool of 4 rows, two of them copies of row 0: 2 passes over the clients' rows, and each client's pick is the
    hand-computed lowest loss, the first row on ties (a copy of row 0 is never picked over row 0)."""
    fed = small_federation(FlisDC(), num_clients=6, public_size=30)
    alg, sizes = fed.algorithm, fed.data.val.sizes()
    other = fed.server.model.random_params(1)
    alg.models = torch.stack([other, fed.server.model.initial_params, other, other])
    rows = counting_loss_rows(fed)
    clients = [0, 3, 5]
    alg.pick_pool_models(clients)
    assert sum(rows) == 2 * int(sizes[clients].sum())
    assert alg.assignment[clients].tolist() == [hand_choice(fed, alg.models[:2], c, "val") for c in clients]


def test_the_plan_line_names_the_work_on_every_client():
    ifca = small_federation(IFCA(num_clusters=2), num_clients=6, clients_per_round=2)
    assert ifca.execution.plan.every_client == [
        "every client picks its cluster by loss in each evaluated round (federation.eval_every)"
    ]
    assert ifca.execution.plan.describe().endswith(
        "; on every client: every client picks its cluster by loss in each evaluated round (federation.eval_every)"
    )
    assert (
        "every client that has not trained yet" in small_federation(FlisDC(), public_size=30).execution.plan.describe()
    )
    for method, said in [
        (FLHC(cluster_round=2, num_clusters=2), "trains every client in its clustering round"),
        (FeSEM(num_clusters=2), "trains every client in its seeding round"),
        (FlisHC(), "trains every client in its phase 0"),
        (PACFL(num_clusters=2), "every client sends its data subspace once"),
    ]:
        plan = small_federation(method, public_size=30).execution.plan
        assert len(plan.every_client) == 1 and plan.every_client[0].startswith(said), plan.every_client
    assert small_federation(FedAvg()).execution.plan.every_client == []
