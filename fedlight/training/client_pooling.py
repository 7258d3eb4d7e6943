"""Max-pooling many clients at once as one pooling over their channels, for vectorized training on a CPU.

Under `torch.func.vmap` a convolution with per-client weights runs as one grouped convolution: its output is one
(batch, clients x channels, h, w) tensor, channels-last on a CPU (`fedlight.training.vectorized`). vmap's own rule
for max-pooling folds the clients into the batch instead, (clients x batch, channels, h, w), which that memory order
cannot give without a transposing copy, and pools the copy in the slow NCHW order; its backward copies back. Max-
pooling treats every channel alone, so pooling the (batch, clients x channels, h, w) view is the same computation:
the same outputs, the same indices (a position within the channel's own plane) and so the same gradients, with no
copy and on the channels-last path. Measured on LeNet-5's vectorized step (20 clients, batch 10, channels-last
inputs, the two rules taking turns): 21.8 -> 16.2 ms (docs/results.md, "client_pooling.py").

`clients_in_channels()` puts this rule in place of vmap's own for `aten::max_pool2d_with_indices` and its backward
for the duration (`torch.library.register_vmap`: one Python call per pooling, where an autograd.Function with a
vmap rule cost more in functorch's bookkeeping than the copies it saved). The rule is exact for any caller, so a
vmap elsewhere in the process meanwhile is only differently laid out. Where torch cannot register it, vmap's own
rule stays.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

POOL = "aten::max_pool2d_with_indices"
POOL_BACKWARD = "aten::max_pool2d_with_indices_backward"


def clients_into_channels(t: Tensor, client_dim: int | None, clients: int) -> Tensor:
    """A stack of per-client inputs of 2-d pooling, each (channels, h, w) or (batch, channels, h, w), with the
    clients at `client_dim` (None: one tensor for all), as one input whose channels are the clients' channels
    client by client: (clients x channels, h, w) or (batch, clients x channels, h, w). A view when the memory order
    allows, as a grouped convolution's output does."""
    if client_dim is None:
        t, client_dim = t.expand(clients, *t.shape), 0
    channel_dim = t.dim() - 4  # of one client's tensor, once the clients' dimension stands before it
    t = t.movedim(client_dim, channel_dim)
    return t.flatten(channel_dim, channel_dim + 1)


def clients_out_of_channels(t: Tensor, clients: int) -> tuple[Tensor, int]:
    """`clients_into_channels` undone, as a view: (the stack, the clients' dimension in it)."""
    channel_dim = t.dim() - 3
    return t.unflatten(channel_dim, (clients, t.shape[channel_dim] // clients)), channel_dim


def _pool_rule(info: Any, in_dims: tuple, x: Tensor, *args: Any) -> tuple:
    n = info.batch_size
    out, indices = torch.ops.aten.max_pool2d_with_indices(clients_into_channels(x, in_dims[0], n), *args)
    (out, dim), (indices, _) = clients_out_of_channels(out, n), clients_out_of_channels(indices, n)
    return (out, indices), (dim, dim)


def _pool_backward_rule(
    info: Any, in_dims: tuple, grad: Tensor, x: Tensor, *args: Any
) -> tuple[Tensor, int]:  # args: kernel, stride, padding, dilation, ceil_mode, indices
    n = info.batch_size
    *settings, indices = args
    merged = [clients_into_channels(t, d, n) for t, d in ((grad, in_dims[0]), (x, in_dims[1]), (indices, in_dims[7]))]
    grad_x = torch.ops.aten.max_pool2d_with_indices_backward(merged[0], merged[1], *settings, merged[2])
    return clients_out_of_channels(grad_x, n)


@contextmanager
def clients_in_channels() -> Iterator[bool]:
    """Within: vmap pools clients as one pooling over their channels (forward and backward). Yields whether the rule
    is in place (False where this torch cannot override vmap's rule: its own then applies, as correct and slower)."""
    library = None
    try:
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            torch.library.register_vmap(POOL, _pool_rule, lib=library)
            torch.library.register_vmap(POOL_BACKWARD, _pool_backward_rule, lib=library)
    except (AttributeError, RuntimeError, NotImplementedError):
        if library is not None:
            library._destroy()
        library = None
    try:
        yield library is not None
    finally:
        if library is not None:
            library._destroy()
