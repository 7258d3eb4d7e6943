"""pFedHN: "Personalized Federated Learning using Hypernetworks" (Shamsian, Navon, Fetaya, Chechik; ICML 2021),
section 3 and Algorithm 1.

A hypernetwork on the server, h(v; phi), maps a learnable embedding v_i of each client to the weights of the target
network (the run's configured network, every parameter entry of its flat vector). A round:

    for each selected client i:  theta_i = h(v_i; phi)                                      (`client_model`)
        the client trains theta_i with the module's SGD (the engine's training, vectorized over the round's
        clients: the round's theta_i are answered from `client_model`, as FedAMP answers its cloud models)
    server: delta_i = theta_i(trained) - theta_i; the paper's pseudo-gradients (Eq. 4-5)
        grad_phi = -sum_i (d theta_i / d phi)^T delta_i,   grad_v_i = -(d theta_i / d v_i)^T delta_i
        one `autograd.grad(theta, (phi, v), grad_outputs=-delta)` per group of clients (`pseudo_gradients`),
        then one step of the server's SGD on phi and on each v_i (`sgd_step_`)
    evaluation: every client with its own generated model h(v_i; phi), the paper's personalized model

The hypernetwork (`HyperNetwork`): v_i -> Linear(e, hidden) -> n_hidden x [ReLU, Linear(hidden, hidden)] -> one
linear head (hidden -> the network's parameter entries, the flat vector's parameters in order). One head for the
flat vector is the authors' per-tensor heads (one `nn.Linear(hidden, numel)` per parameter tensor) side by side: the
same function and, as PyTorch's Linear initialization depends only on the fan-in, the same initial distribution.
No chunking (the paper's option for large networks): the head holds hidden x d weights, 100 x 6.6 M = 2.6 GB for
LEAF's FEMNIST CNN, and the server's momentum as much again.

The embeddings are the engine's client state ("embedding", and its momentum "embedding_momentum"): a client never
selected reads its initial embedding, an N(0, 1) draw of its own (nn.Embedding's initialization, seeded by the run's
seed and the client), so the server's memory grows with the clients trained, not with every client.

Defaults, from the authors' code (AvivSham/pFedHN, experiments/pfedhn/trainer.py and models.py; FL-bench's pFedHN
keeps them but for its automatic embedding size, int((1 + clients) / 4)): embedding size 1 + clients / 4 (their
`embed_dim = -1`: `int(1 + num_nodes / 4)`), hidden size 100 (`hyper-hid`), 3 hidden layers (`n-hidden`), the
server's SGD at lr 0.01 with momentum 0.9 and weight decay 1e-3 (`lr`, `wd`), the embeddings at the same lr
(`embed-lr` None), the gradient's norm clipped to 50 (their `clip_grad_norm_(hnet.parameters(), 50)`). Their
client's 50 inner steps of SGD (lr 5e-3, momentum 0.9, weight decay 5e-5, gradients clipped at 50) are the run's
module and local epochs here. PFLlib ships no pFedHN.

Deviations, and why:
- A round trains its clients together: their theta_i are all generated from the round's phi, and the server takes
  one step on the SUM of their pseudo-gradients. Algorithm 1 samples one client a step; the sum makes one round of m
  clients equal, to first order, m of the paper's steps from the same phi (so a round moves phi as far as m client
  visits of the authors' code, at the authors' lr). Each v_i receives its own client's pseudo-gradient only. The
  gradient norm is clipped over phi's and the round's embeddings' gradients together (the authors': one client's).
- The head's bias starts at the run's initial model, so h(v) = the initial model + W f(v) at the start, and every
  method on a config starts from the same network; the authors' heads start with PyTorch's default bias, which would
  also generate a normalization layer's unit scales near 0. The rest of phi has PyTorch's default initialization
  (drawn on the CPU from the run's seed).
- An embedding's momentum and weight decay act only in the rounds its client takes part (its row is read, stepped
  and written then); the authors' dense nn.Embedding gradient decays and moves every client's embedding at every
  step, which would make a round's cost grow with all clients.
- Buffers (BatchNorm running statistics) are not generated: every client starts from the shared buffers, and the
  round's trained buffers are averaged into them, weighted by training-set size, as FedAvg does.
- A client whose update is not finite is left out of the round (the engine's rule); its embedding is not stepped.
- Newcomers (clients that arrive after training; the paper's experiment on novel clients, section 5): phi is frozen
  and a fresh embedding (an N(0, 1) draw, as an untrained client's) is fitted on the newcomer's training split by
  the server's SGD on v alone (embed_lr, momentum, weight decay; no clipping) on the gradient of the module's own
  training loss at h(v), for `newcomer_epochs` epochs; the newcomer is evaluated with h(v) fitted. The paper's text
  was not at hand to check its step count and step size: 10 epochs are ours, as FedRep's head fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlight.plugin import Algorithm, ClientModels, ClusterAverage, Newcomers, RoundUpdates

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class HyperNetwork(nn.Module):
    """h(v; phi): embeddings (m, e) -> generated parameter vectors (m, d), an MLP with `n_hidden` hidden layers and
    one linear head."""

    def __init__(self, embed_dim: int, hidden_dim: int, n_hidden: int, out_dim: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(embed_dim, hidden_dim)]
        for _ in range(n_hidden):
            layers += [nn.ReLU(), nn.Linear(hidden_dim, hidden_dim)]
        self.mlp = nn.Sequential(*layers)
        self.head = nn.Linear(hidden_dim, out_dim)

    def forward(self, embeddings: Tensor) -> Tensor:
        return self.head(self.mlp(embeddings))


def default_init_(module: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default initialization of every Linear layer (weights and biases uniform in +-1/sqrt(fan_in)), drawn
    on the CPU from `generator` and copied to the module's device, so a CPU and a GPU run start alike."""
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                bound = 1 / math.sqrt(layer.in_features)
                for param in (layer.weight, layer.bias):
                    param.copy_(torch.empty(param.shape).uniform_(-bound, bound, generator=generator))


def pseudo_gradients(hypernet: nn.Module, embeddings: Tensor, deltas: Tensor) -> tuple[list[Tensor], Tensor]:
    """The paper's pseudo-gradients (Eq. 4-5) of phi and of each embedding: the gradients of
    -sum_i <delta_i, h(v_i; phi)> at the given embeddings, i.e. -(d theta / d phi)^T delta summed over the rows
    and -(d theta_i / d v_i)^T delta_i for each row. Returns (one tensor per parameter of `hypernet`, (m, e))."""
    params = list(hypernet.parameters())
    with torch.enable_grad():  # the engine may call the aggregation hooks without gradients
        embeddings = embeddings.detach().requires_grad_(True)
        grads = torch.autograd.grad(hypernet(embeddings), [*params, embeddings], grad_outputs=-deltas)
    return list(grads[:-1]), grads[-1]


def clip_scale(grads: Sequence[Tensor], max_norm: float) -> tuple[float, float]:
    """(total norm of `grads`, the factor `torch.nn.utils.clip_grad_norm_` would scale them by to a norm of at most
    `max_norm`: min(1, max_norm / (norm + 1e-6)))."""
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
    return norm, min(1.0, max_norm / (norm + 1e-6))


def sgd_step_(param: Tensor, grad: Tensor, buffer: Tensor, lr: float, momentum: float, weight_decay: float) -> None:
    """One step of `torch.optim.SGD` (no dampening, no Nesterov) in place, with the momentum buffer kept outside:
    d = grad + weight_decay param, buffer <- momentum buffer + d, param <- param - lr buffer (a zero buffer makes the
    first step the optimizer's first)."""
    buffer.mul_(momentum).add_(grad).add_(param, alpha=weight_decay)  # in place: no copy of a large head
    param.sub_(buffer, alpha=lr)


def positive(name: str, value: float, example: str) -> None:
    """Refuse a non-positive option in one line."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}: give a positive value such as {example}")


class PFedHN(Algorithm):
    """A server hypernetwork generates each client's model from its learned embedding; the clients train their
    generated models, and their changes train the hypernetwork and their embeddings through the pseudo-gradient.

    Args:
        embed_dim: size of a client's embedding (>= 1); None: 1 + clients / 4 (the authors').
        hidden_dim: width of the hypernetwork's hidden layers (>= 1; the authors' 100).
        n_hidden: hidden layers after the first (>= 0; the authors' 3).
        hn_lr: the server's SGD learning rate on phi (> 0; the authors' 0.01).
        embed_lr: the learning rate on the embeddings (> 0); None: hn_lr (the authors').
        hn_momentum: the server's SGD momentum, on phi and on each embedding (in [0, 1); the authors' 0.9).
        hn_weight_decay: the server's weight decay, on phi and on each embedding (>= 0; the authors' 1e-3).
        max_grad_norm: the pseudo-gradient's norm is clipped to this (> 0; the authors' 50).
        newcomer_epochs: epochs of a newcomer's embedding fit on its training split, phi frozen (>= 1).
        participation: share of clients selected each round.
    """

    #: the pseudo-gradients come from the re-based change (staleness-weighted, at the current phi); a client's
    #: embedding, unchanged while it trains, steps at its arrival

    def __init__(
        self,
        embed_dim: int | None = None,
        hidden_dim: int = 100,
        n_hidden: int = 3,
        hn_lr: float = 0.01,
        embed_lr: float | None = None,
        hn_momentum: float = 0.9,
        hn_weight_decay: float = 1e-3,
        max_grad_norm: float = 50.0,
        newcomer_epochs: int = 10,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if embed_dim is not None and not embed_dim >= 1:
            raise ValueError(
                f"embed_dim must be >= 1, got {embed_dim}: give a positive size such as 8, or null for 1 + clients / 4"
            )
        if not hidden_dim >= 1:
            raise ValueError(f"hidden_dim must be >= 1, got {hidden_dim}: give a positive width such as 100")
        if not n_hidden >= 0:
            raise ValueError(f"n_hidden must be >= 0, got {n_hidden}: give 0 or more hidden layers, such as 3")
        positive("hn_lr", hn_lr, "0.01")
        if embed_lr is not None:
            positive("embed_lr", embed_lr, "0.01 (or null for hn_lr)")
        if not 0 <= hn_momentum < 1:
            raise ValueError(f"hn_momentum must be in [0, 1), got {hn_momentum}: give a value such as 0.9")
        if not hn_weight_decay >= 0:
            raise ValueError(f"hn_weight_decay must be >= 0, got {hn_weight_decay}: give 0 or more, such as 0.001")
        positive("max_grad_norm", max_grad_norm, "50")
        if not newcomer_epochs >= 1:
            raise ValueError(f"newcomer_epochs must be >= 1, got {newcomer_epochs}: give a count such as 10")
        self.embed_dim, self.hidden_dim, self.n_hidden = embed_dim, int(hidden_dim), int(n_hidden)
        self.hn_lr, self.embed_lr = hn_lr, hn_lr if embed_lr is None else embed_lr
        self.hn_momentum, self.hn_weight_decay, self.max_grad_norm = hn_momentum, hn_weight_decay, max_grad_norm
        self.newcomer_epochs = int(newcomer_epochs)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        size = int(self.embed_dim) if self.embed_dim is not None else int(1 + server.num_clients / 4)
        self.size = size
        self.generated = server.model.parameter_mask()  # what h generates; buffers stay shared (models[0])
        with torch.device("meta"):
            hypernet = HyperNetwork(size, self.hidden_dim, self.n_hidden, int(self.generated.sum()))
        self.hypernet = hypernet.to_empty(device=server.device)
        default_init_(
            self.hypernet, torch.Generator().manual_seed(server.random.client_seed(0, 0, "pfedhn_hypernetwork"))
        )
        with torch.no_grad():
            self.hypernet.head.bias.copy_(server.model.initial_params[self.generated])
        self.momenta = [torch.zeros_like(p) for p in self.hypernet.parameters()]
        # a function, not a bound method: a copy of the store (a snapshot) then shares it
        self.embeddings = server.state.declare("embedding", initial=lambda clients: self.initial_embeddings(clients))
        self.embedding_momentum = server.state.declare("embedding_momentum", initial=torch.zeros(size))

    def initial_embeddings(self, clients: Tensor) -> Tensor:
        """(len(clients), e) each client's untrained embedding: an N(0, 1) draw of its own (nn.Embedding's
        initialization), seeded by the run's seed and the client."""
        return self.fresh_embeddings(clients.tolist(), "pfedhn_embedding").to(clients.device)

    def fresh_embeddings(self, clients: list[int], purpose: str) -> Tensor:
        """(len(clients), e) N(0, 1) rows, each drawn on the CPU from (seed, client, purpose)."""
        seeds = [self.server.random.client_seed(0, c, purpose) for c in clients]
        rows = [torch.randn(self.size, generator=torch.Generator().manual_seed(s)) for s in seeds]
        return torch.stack(rows) if rows else torch.zeros(0, self.size)

    # -- the generated models ----------------------------------------------------------------------------------
    def generate(self, embeddings: Tensor) -> Tensor:
        """(m, d) flat models from (m, e) embeddings: h(v) on the parameter entries, the shared buffers elsewhere."""
        with torch.no_grad():
            return self.with_buffers(self.hypernet(embeddings.float()))

    def with_buffers(self, generated: Tensor) -> Tensor:
        """(m, d) flat models from (m, parameter entries) generated rows and the shared buffers (`models[0]`)."""
        models = self.models[0].repeat(len(generated), 1)
        models[:, self.generated] = generated.detach().to(models.dtype)
        return models

    def client_model(self, client: int) -> Tensor:
        """The client's generated model h(v_i; phi): what it trains from in a round and is evaluated with."""
        return self.generate(self.embeddings.read([client]))[0]

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        """Every client is evaluated with its own generated model, built when evaluated."""
        n = self.server.num_clients
        return ClientModels(self.client_model, n), torch.arange(n, device=self.server.device)

    # -- the server's step -------------------------------------------------------------------------------------
    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """The pseudo-gradients of the round's clients, a group at a time (summed over groups and processes for phi,
        each client's own for its embedding), clipped together, then one SGD step on phi and on each embedding; the
        trained buffers are averaged into the shared ones."""
        phi_grads: list[Tensor] = []  # summed over the groups
        buffers = ~self.generated
        average = (
            ClusterAverage(1, int(buffers.sum()), self.models.dtype, self.models.device) if buffers.any() else None
        )
        device = self.models.device
        client_parts = [torch.zeros(0, dtype=torch.long, device=device)]
        embedding_parts = [torch.zeros(0, self.size, device=device)]
        for group in updates.groups():
            deltas = (group.params[:, self.generated] - group.starts[:, self.generated]).float()
            grads, own = pseudo_gradients(self.hypernet, self.embeddings.read(group.clients), deltas)
            phi_grads = grads if not phi_grads else [total.add_(grad) for total, grad in zip(phi_grads, grads)]
            client_parts.append(group.clients)
            embedding_parts.append(own)
            if average is not None:
                average.add(
                    torch.zeros_like(group.clients), group.num_samples.to(self.models.dtype), group.params[:, buffers]
                )
            del group, deltas  # or they would stay alive while the next group trains
        if not phi_grads:  # this process trained no client (or left every one out)
            phi_grads = [torch.zeros_like(p) for p in self.hypernet.parameters()]
        updates.sum_over_processes_(*phi_grads)
        if average is not None:
            average.reduce(updates)
        clients = updates.cat_over_processes(torch.cat(client_parts))
        embedding_grads = updates.cat_over_processes(torch.cat(embedding_parts))
        if not len(clients):
            return  # every client left out: nothing to learn from
        norm, scale = clip_scale([*phi_grads, embedding_grads], self.max_grad_norm)
        self.log("pfedhn/grad_norm", norm)
        with torch.no_grad():
            for param, grad, buffer in zip(self.hypernet.parameters(), phi_grads, self.momenta):
                sgd_step_(param, grad.mul_(scale), buffer, self.hn_lr, self.hn_momentum, self.hn_weight_decay)
        embeddings, momenta = self.embeddings.read(clients), self.embedding_momentum.read(clients)
        sgd_step_(
            embeddings, embedding_grads.mul_(scale), momenta, self.embed_lr, self.hn_momentum, self.hn_weight_decay
        )
        self.embeddings.write(clients, embeddings)
        self.embedding_momentum.write(clients, momenta)
        if average is not None:
            self.models[0, buffers] = average.means()[1][0]  # some client trained: the buffers have weight

    # -- clients that arrive after training --------------------------------------------------------------------
    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, None]:
        """Each newcomer's generated model from an embedding fitted on its training split with phi frozen."""
        count = newcomers.count
        embeddings = self.fresh_embeddings(list(range(count)), "pfedhn_newcomer").to(self.models.device)
        fitted = (
            torch.stack([self.fit_embedding(newcomers, j, embeddings[j]) for j in range(count)])
            if count
            else embeddings
        )
        return self.generate(fitted), torch.arange(count, device=self.models.device), None

    def fit_embedding(self, newcomers: Newcomers, newcomer: int, embedding: Tensor) -> Tensor:
        """`newcomer_epochs` epochs of the server's SGD on one newcomer's embedding alone: at each batch, the
        gradient of the module's training loss at h(v) (`server.model.loss_and_grad`), carried back through h to v."""
        server, v, buffer = self.server, embedding.clone(), torch.zeros_like(embedding)
        devices = [v.device] if v.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad():  # dropout draws repeat in a resumed run
            torch.manual_seed(server.random.client_seed(newcomers.round, newcomer, "pfedhn_newcomer"))
            for _, step, batch in newcomers.batches(newcomer, self.newcomer_epochs, purpose="pfedhn_embedding"):
                leaf = v.detach().requires_grad_(True)
                theta = self.hypernet(leaf[None])
                _, grad = server.model.loss_and_grad(self.with_buffers(theta)[0], batch, step)
                (v_grad,) = torch.autograd.grad(theta[0], leaf, grad_outputs=grad[self.generated].float())
                sgd_step_(v, v_grad, buffer, self.embed_lr, self.hn_momentum, self.hn_weight_decay)
        return v

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The base state, phi and its momentum (the embeddings are client states: the engine checkpoints them)."""
        return {
            **super().state_dict(),
            "hypernetwork": {k: v.detach() for k, v in self.hypernet.state_dict().items()},
            "hypernetwork_momentum": list(self.momenta),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.hypernet.load_state_dict(state["hypernetwork"])  # copies into phi's own tensors
        for buffer, saved in zip(self.momenta, state["hypernetwork_momentum"]):
            buffer.copy_(saved)
