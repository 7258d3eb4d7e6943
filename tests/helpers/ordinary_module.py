"""A LightningModule written for `Trainer.fit`, used unchanged as a federated client in the tests: BatchNorm,
`self.log` in `training_step`, SGD with momentum and a StepLR schedule from `configure_optimizers`."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class OrdinaryModule(L.LightningModule):
    def __init__(self, lr: float = 0.1, gamma: float = 0.5, interval: str = "epoch", batch_norm: bool = True) -> None:
        super().__init__()
        norm = nn.BatchNorm2d(8) if batch_norm else nn.Identity()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3), norm, nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 10))
        self.lr, self.gamma, self.interval = lr, gamma, interval

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("train_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True)
        self.log_dict({"label_mean": y.float().mean()})
        return F.cross_entropy(logits, y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=self.gamma)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.interval}}
