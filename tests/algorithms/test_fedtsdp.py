"""FedTSDP: the Hopkins gate, the two-stage clustering, the public-sample weights, shared-layer averaging within
clusters, the half-layer schedule and the learning-rate decay, against hand computations and FedAvg."""

import math

import pytest
import torch

from fedlight import RoundUpdates
from fedlight.plugin.algorithm import Updates
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedtsdp import FedTSDP
from fedlight.datamodules import ClassesPerClient, DigitsFederated
from fedlight.engine.federation import Federation, FederationConfig
from fedlight.models import Classifier, FedTSDPCNN, SmallCNN
from fedlight.training.layer_masks import tensor_names

from helpers.federations import every_row, small_federation

NEVER = math.inf  # a Hopkins threshold no statistic passes
ALWAYS = -1.0  # one every statistic passes


def federation(
    algorithm, num_clients: int = 6, network=None, public_size: int = 60, lr: float = 0.1, seed: int = 0
) -> Federation:
    """Digits, two classes per client, with server public data; a narrow CNN, one local epoch."""
    torch.manual_seed(seed)
    model = Classifier(network if network is not None else SmallCNN(1, 10, 8, width=8), lr=lr)
    data = DigitsFederated(num_clients=num_clients, partition=ClassesPerClient(2), public_size=public_size)
    config = FederationConfig(rounds=3, local_epochs=1, batch_size=32, accelerator="cpu", vectorize=0)
    return Federation(data, model, algorithm, config, seed=seed)


def one_round(fed: Federation, round: int) -> Updates:
    """Run a round hook by hook and return the updates the server saw."""
    alg = fed.algorithm
    updates = fed.execution.train(round, alg.select_clients(round))
    held = RoundUpdates.of(updates)
    alg.pre_aggregation(round, held)
    alg.aggregate(round, held)
    alg.post_aggregation(round, held)
    return updates


def groups(labels) -> set[frozenset[int]]:
    """A clustering as a set of member sets (label names do not matter)."""
    return {frozenset(i for i, label in enumerate(labels) if label == g) for g in set(labels.tolist())}


def test_never_clustering_with_a_constant_learning_rate_is_fedavg():
    a = federation(FedAvg())
    b = federation(FedTSDP(hopkins_threshold=NEVER, lr_decay=1.0))
    for r in (1, 2):
        ma, mb = a.run_round(r), b.run_round(r)
    assert torch.equal(a.algorithm.models, b.algorithm.models)
    assert ma.scalars["test/acc_mean"] == mb.scalars["test/acc_mean"]
    assert mb.scalars["fedtsdp/clustered"] == 0.0 and mb.scalars["fedtsdp/shared_layers_effective"] == 3.0
    assert b.algorithm.personal is None and 0.0 <= mb.scalars["fedtsdp/hopkins"] <= 1.0


def test_learning_rate_decays_by_the_factor_per_round():
    decayed = federation(FedTSDP(hopkins_threshold=NEVER, lr_decay=0.5), lr=0.2)
    plain = federation(FedAvg(), lr=0.05)  # 0.2 * 0.5 ** (3 - 1)
    start = decayed.server.model.initial_params
    trained, _ = decayed.algorithm.train_client(3, 1, start)
    expected = plain.server.clients.train(3, 1, start).params
    assert torch.allclose(trained, expected, atol=1e-6)


def test_one_event_makes_the_last_bias_personal_with_each_clients_own_values():
    fed = federation(FedTSDP(hopkins_threshold=ALWAYS, eps_weights=1e6), network=FedTSDPCNN(1, 10, 8))
    alg = fed.algorithm
    updates = one_round(fed, 1)
    assert alg.shared_layers == pytest.approx(4 * 0.98) and alg.effective_shared == 3.5
    assert tensor_names(fed.flat, alg.personal_mask) == ["network.fc2.bias"]
    assert alg.personal.row_shape == (10,)
    for i, k in enumerate(updates.clients.tolist()):  # newly personal: the client's own trained bias
        assert torch.equal(alg.personal[k], updates.params[i][alg.personal_mask])
    # everything else: the size-weighted mean over the client's cluster, computed here in float64
    n = updates.num_samples.double()
    for c in range(len(alg.models)):
        members = (alg.assignment[updates.clients] == c).nonzero().flatten()
        mean = (n[members, None] * updates.params[members].double()).sum(0) / n[members].sum()
        assert torch.allclose(alg.models[c][~alg.personal_mask].double(), mean[~alg.personal_mask], atol=1e-6)
    assert alg.stage2_mask().all()  # stage 2 compares all parameters (no buffers here) ...
    alg.weights = "shared"
    assert torch.equal(alg.stage2_mask(), ~alg.personal_mask)  # ... or only the shared ones


def test_seven_events_make_the_whole_last_layer_personal():
    fed = federation(
        FedTSDP(hopkins_threshold=ALWAYS, eps_inference=10.0, eps_weights=1e6), network=FedTSDPCNN(1, 10, 8)
    )
    for r in range(1, 8):
        one_round(fed, r)
    alg = fed.algorithm
    assert alg.events == 7 and alg.effective_shared == 3.0  # 4 * 0.98**7 = 3.47
    assert tensor_names(fed.flat, alg.personal_mask) == ["network.fc2.weight", "network.fc2.bias"]


def test_two_stage_labels_on_constructed_matrices():
    fed = federation(FedTSDP())
    alg = fed.algorithm
    # Stage 1: clients 0-2 and 3-5 answer alike (JS 0.01 inside, 0.5 across). Stage 2: client 2's weights
    # are 10 away from 0 and 1; 3, 4, 5 are close.
    js = torch.full((6, 6), 0.5)
    js[:3, :3] = js[3:, 3:] = 0.01
    js.fill_diagonal_(0.0)
    dist = torch.full((6, 6), 20.0)
    dist[:3, :3] = torch.tensor([[0.0, 1.0, 10.0], [1.0, 0.0, 10.0], [10.0, 10.0, 0.0]])
    dist[3:, 3:] = 1.0
    dist.fill_diagonal_(0.0)
    labels, stage1 = alg.two_stage_labels(js, dist)
    assert groups(stage1) == {frozenset({0, 1, 2}), frozenset({3, 4, 5})}
    assert groups(labels) == {frozenset({0, 1}), frozenset({2}), frozenset({3, 4, 5})}  # noise: own cluster
    alg.noise = "nearest"
    assert groups(alg.two_stage_labels(js, dist)[0]) == {frozenset({0, 1, 2}), frozenset({3, 4, 5})}
    alg.noise, alg.stages = "singletons", "inference"
    assert groups(alg.two_stage_labels(js, dist)[0]) == {frozenset({0, 1, 2}), frozenset({3, 4, 5})}
    alg.stages = "weights"  # DBSCAN(3.5) on the weights of everyone
    assert groups(alg.two_stage_labels(js, dist)[0]) == {frozenset({0, 1}), frozenset({2}), frozenset({3, 4, 5})}


def test_reassign_gives_fresh_clusters_and_absent_clients_keep_theirs():
    fed = federation(FedTSDP())
    alg = fed.algorithm
    d = fed.flat.numel
    alg.models = torch.stack([torch.full((d,), 1.0), torch.full((d,), 2.0)])
    alg.assignment = torch.tensor([0, 0, 1, 1, 1, 1])
    alg.reassign(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]).numpy())
    a = alg.assignment.tolist()
    # {0}, {1, 2} are new; absent clients 3-5 stay in their old cluster; old cluster 0 is empty and dropped
    assert len(alg.models) == 3 and a[1] == a[2] and a[3] == a[4] == a[5] and len({a[0], a[1], a[3]}) == 3
    assert torch.equal(alg.models[a[3]], torch.full((d,), 2.0))
    assert torch.equal(alg.models[a[0]], torch.full((d,), 1.0))  # a new cluster starts from its member's model
    assert torch.equal(alg.models[a[1]], torch.full((d,), 1.0))


def test_public_weights_literal_and_count_updates():
    alg = federation(FedTSDP(), public_size=60).algorithm
    N, B = 10000, 50
    alg.public_weights = torch.full((N,), 1.0 / N, dtype=torch.float64)
    batch = torch.arange(B)
    alg.update_public_weights(batch)  # Eq. 7-8: W[batch] += N / B; W /= sum(W)
    mass = float(alg.public_weights[batch].sum())
    assert mass == pytest.approx((B / N + N) / (1 + N), rel=1e-12) and mass > 0.999
    assert float(alg.public_weights.sum()) == pytest.approx(1.0)
    alg.sampling = "count"
    alg.public_weights = torch.ones(N, dtype=torch.float64)
    alg.update_public_weights(batch)
    mass = float(alg.public_weights[batch].sum() / alg.public_weights.sum())
    assert mass == pytest.approx((B + N) / (2 * N), rel=1e-12)  # about half the mass, not all


def test_public_batch_is_distinct_per_round_stream_and_weights_only_change_on_events():
    fed = federation(FedTSDP(hopkins_threshold=NEVER, public_batch=20), public_size=60)
    alg = fed.algorithm
    batch = alg.draw_public_batch(5)
    assert len(batch) == 20 and len(set(batch.tolist())) == 20 and batch.max() < 60
    assert torch.equal(batch, alg.draw_public_batch(5)) and not torch.equal(batch, alg.draw_public_batch(6))
    initial = alg.public_weights.clone()
    one_round(fed, 1)
    assert torch.equal(alg.public_weights, initial)  # H <= h_th: W unchanged
    clustered = federation(FedTSDP(hopkins_threshold=ALWAYS, public_batch=20), public_size=60)
    drawn = clustered.algorithm.draw_public_batch(1)  # what round 1 draws from the uniform weights
    one_round(clustered, 1)
    expected = torch.full((60,), 1 / 60, dtype=torch.float64)
    expected[drawn] += 60 / 20
    assert torch.allclose(clustered.algorithm.public_weights, expected / expected.sum())


def test_hopkins_gate_on_real_outputs_and_the_logged_schedule():
    fed = federation(FedTSDP(hopkins_threshold=ALWAYS), num_clients=6)
    metrics = fed.run_round(1)
    assert metrics.scalars["fedtsdp/clustered"] == 1.0 and metrics.scalars["fedtsdp/events"] == 1.0
    assert metrics.scalars["fedtsdp/shared_layers"] == pytest.approx(3 * 0.98)
    assert metrics.scalars["fedtsdp/shared_layers_effective"] == 2.5
    assert metrics.scalars["fedtsdp/clusters_stage2"] == metrics.scalars["cluster/count"] == len(fed.algorithm.models)
    assert metrics.scalars["fedtsdp/clusters_stage1"] <= metrics.scalars["fedtsdp/clusters_stage2"]
    assert 0.0 <= metrics.scalars["fedtsdp/js_min"] <= metrics.scalars["fedtsdp/js_max"] <= math.log(2)


def test_checkpoint_after_an_event_resumes_identically():
    make = lambda: federation(FedTSDP(hopkins_threshold=ALWAYS, eps_weights=1e6, lr_decay=0.9))  # noqa: E731
    a = make()
    a.run_round(1)
    state = a.state_dict()
    state["algorithm"] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state["algorithm"].items()}
    b = make()
    assert b.algorithm.personal is None  # every layer shared until an event
    b.load_state_dict(state)
    assert torch.equal(a.algorithm.personal_mask, b.algorithm.personal_mask)
    assert b.algorithm.personal.name == a.algorithm.personal.name == "personal_part.1"  # the event's store
    for r in (2, 3):
        a.run_round(r), b.run_round(r)
    for name in ("models", "assignment", "personal", "public_weights"):
        assert torch.equal(every_row(getattr(a.algorithm, name)), every_row(getattr(b.algorithm, name))), name
    assert a.algorithm.personal.name == b.algorithm.personal.name
    assert a.algorithm.shared_layers == b.algorithm.shared_layers


def test_needs_public_data_and_valid_settings():
    with pytest.raises(ValueError, match="public_size"):
        small_federation(FedTSDP(), num_clients=2)
    with pytest.raises(ValueError, match="noise"):
        FedTSDP(noise="keep")
    with pytest.raises(ValueError, match="exceeds"):
        federation(FedTSDP(initial_shared=5))


def _check_classes(node, names):
    """Import every class_path of a config document and bind its init_args to the class's signature (catches
    unknown or misspelt keys without the CLI's slower full parse)."""
    import importlib
    import inspect

    if isinstance(node, dict):
        if "class_path" in node:
            module, _, name = names.get(node["class_path"], node["class_path"]).rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            inspect.signature(cls).bind(**node.get("init_args", {}))
        for value in node.values():
            _check_classes(value, names)


def test_digits_configs_differ_only_in_the_algorithm_and_all_configs_parse():
    from pathlib import Path

    import yaml

    from fedlight.run.cli import build_parser, expand_short_names
    from fedlight.run.registry import short_names

    root = Path(__file__).resolve().parents[2] / "configs"
    splits = (("skew", ["fedavg", "fedper", "lgfedavg", "fedtsdp"]), ("iid", ["fedavg", "fedtsdp"]))
    digits = [root / "digits" / split / f"{n}.yaml" for split, names in splits for n in names]
    papers = sorted((root / "papers" / "fedtsdp").glob("*.yaml"))
    assert len(papers) == 20  # 3 data sets x {IID, Dir 0.5, Dir 0.2} x {CNN, ResNet-18} + CIFAR-10 2-class x 2
    docs = {path: yaml.safe_load(path.read_text()) for path in digits + papers}
    names = short_names()
    for path, doc in docs.items():
        _check_classes(doc, names)
        if path in papers:
            args = doc["algorithm"]["init_args"]
            assert doc["algorithm"]["class_path"] == "fedtsdp" and args["lr_decay"] == 0.95
            fed = doc["federation"]
            assert (fed["rounds"], fed["local_epochs"], fed["batch_size"]) == (200, 2, 50)
            assert (args["hopkins_threshold"], args["eps_inference"], args["eps_weights"], args["psi"]) == (
                0.65,
                0.15,
                3.5,
                0.98,
            )
    for split, names_ in splits:  # a fair comparison: same data, model, optimizer and rounds in a split
        rest = [
            {k: v for k, v in docs[root / "digits" / split / f"{n}.yaml"].items() if k != "algorithm"} for n in names_
        ]
        assert all(r == rest[0] for r in rest), f"digits/{split} configs differ in more than the algorithm"
    parser = build_parser()  # one full, type-checked parse of each kind
    for path in (root / "digits" / "skew" / "fedtsdp.yaml", papers[0]):
        cfg = parser.parse_args(expand_short_names(["fit", "--config", str(path)])).fit
        assert cfg.algorithm.class_path == "fedlight.algorithms.fedtsdp.FedTSDP"
