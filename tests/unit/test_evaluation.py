"""Per-client metrics computed for all clients at once agree with torchmetrics client by client."""

import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

from fedlight.plugin.evaluation import per_client_classification, summarize


def test_matches_torchmetrics_per_client():
    g = torch.Generator().manual_seed(0)
    num_clients, num_classes = 5, 7
    sizes = [9, 1, 30, 4, 16]
    client = torch.repeat_interleave(torch.arange(num_clients), torch.tensor(sizes))
    logits = torch.randn(len(client), num_classes, generator=g)
    target = torch.randint(0, num_classes, (len(client),), generator=g)
    target[:5] = logits[:5].argmax(1)  # some correct predictions
    got = per_client_classification(logits, target, client, num_clients, num_classes)
    for k in range(num_clients):
        rows = client == k
        acc = multiclass_accuracy(logits[rows], target[rows], num_classes=num_classes, average="micro")
        f1 = multiclass_f1_score(logits[rows], target[rows], num_classes=num_classes, average="macro")
        loss = F.cross_entropy(logits[rows], target[rows])
        assert torch.isclose(got["acc"][k], acc), k
        assert torch.isclose(got["f1"][k], f1, atol=1e-6), k
        assert torch.isclose(got["loss"][k], loss, atol=1e-6), k


def test_summary_by_hand():
    out = summarize({"acc": np.array([0.5, 1.0, 0.75]), "loss": np.array([1.0, 3.0, 2.0])}, "test")
    assert out["test/acc_mean"] == 0.75 and out["test/acc_worst"] == 0.5
    assert np.isclose(out["test/acc_std"], np.sqrt((0.0625 + 0.0625 + 0) / 3))
    assert out["test/loss_worst"] == 3.0


def test_an_empty_evaluation_split_is_refused_before_training_with_the_fix():
    import pytest

    from fedlight.datamodules import DigitsFederated
    from fedlight.engine.federation import Federation, FederationConfig
    from fedlight.models import Classifier, SmallCNN

    data = DigitsFederated(num_clients=4, val_fraction=0.0)
    with pytest.raises(ValueError, match="eval_split='val'.*no client has a sample.*val_fraction"):
        Federation(
            data,
            Classifier(SmallCNN(1, 10, 8, width=8)),
            None,
            FederationConfig(rounds=1, accelerator="cpu", eval_split="val", vectorize=0),
        )
