"""The batch KV cache the HF backend decodes over: preallocated left-padded buffers written in place.

Each prompt is prefilled alone (:meth:`HFBackend._prefill`); :func:`decode_cache` copies the prompts' keys
and values once into ``(B, H, capacity, D)`` buffers carved from a reusable :class:`Arena`, and each layer
(:func:`growing_layer`) appends a step's keys/values in place, grows when a long answer outruns the room,
and can drop finished rows and unneeded left padding (``select``). transformers' ``DynamicLayer``
concatenates instead, copying the whole batch cache at every token.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any


class Arena:
    """One reusable block of memory for the batch KV buffers. A batch's buffers are tens of MB; allocated fresh
    for every batch, their pages were faulted in anew each time (the largest part of building the cache).
    Buffers carved from the arena are valid until the next :meth:`start`, i.e. for one batch (batches run one
    at a time on the backend's model thread)."""

    def __init__(self) -> None:
        self.block: Any = None
        self.used = 0

    def start(self, numel: int, like: Any) -> None:
        if self.block is None or self.block.numel() < numel or self.block.dtype != like.dtype \
                or self.block.device != like.device:
            self.block = like.new_empty(numel)
        self.used = 0

    def take(self, shape: tuple[int, ...]) -> Any:
        n = math.prod(shape)
        out = self.block[self.used:self.used + n].view(shape)
        self.used += n
        return out


def decode_cache(prefills: Sequence[list[tuple[Any, Any]]], lengths: list[int], capacity: int,
                 arena: Arena) -> Any:
    """A batch KV cache of ``GrowingLayer`` s (:func:`growing_layer`): the prompts' per-layer ``(keys,
    values)`` (each (1, H, L_b, D)) left-padded to ``max(lengths)`` in buffers with room for ``capacity``
    positions, carved from ``arena``."""
    from transformers.cache_utils import Cache

    width = max(lengths)
    layers = []
    shapes = [((len(prefills), k0.shape[1], capacity, k0.shape[3]), (len(prefills), v0.shape[1], capacity, v0.shape[3]))
              for k0, v0 in prefills[0]]
    arena.start(sum(math.prod(a) + math.prod(b) for a, b in shapes), prefills[0][0][0])
    for li, (k_shape, v_shape) in enumerate(shapes):
        # Uninitialised beyond ``width`` (written before it is read); the padding is zeroed, as masked
        # positions must hold finite values (0 × NaN is NaN).
        kb, vb = arena.take(k_shape), arena.take(v_shape)
        for b, (kv, n) in enumerate(zip(prefills, lengths, strict=True)):
            kb[b, :, :width - n] = 0
            vb[b, :, :width - n] = 0
            kb[b, :, width - n:width] = kv[li][0][0]
            vb[b, :, width - n:width] = kv[li][1][0]
        layers.append(growing_layer()(kb, vb, width))
    return Cache(layers=layers)


def layer_kv(cache: Any) -> list[tuple[Any, Any]]:
    """Per-layer ``(keys, values)`` of a transformers prefill cache (full-attention layers only)."""
    from transformers.cache_utils import DynamicLayer

    out = []
    for li, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                f"HFBackend decodes full-attention caches only; layer {li} is a {type(layer).__name__}"
            )
        out.append((layer.keys, layer.values))
    return out


@functools.cache
def growing_layer() -> type:
    """The ``GrowingLayer`` class (defined on first use: transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """One layer's K/V for batched decoding: preallocated ``(B, H, capacity, D)`` buffers written in
        place. (``DynamicLayer`` concatenates, copying the whole batch cache at every token: that copy was
        the largest cost of a CPU decoding step.)"""

        def __init__(self, keys: Any, values: Any, length: int) -> None:
            super().__init__()
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self.kbuf, self.vbuf, self.length = keys, values, length
            self.keys, self.values = keys[:, :, :length], values[:, :, :length]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            end = self.length + key_states.shape[-2]
            if end > self.kbuf.shape[2]:  # a long answer (or speculation's rejected positions) used up the room
                import torch

                more = max(end, 2 * self.kbuf.shape[2]) - self.kbuf.shape[2]
                self.kbuf = torch.cat((self.kbuf, self.kbuf.new_zeros(*self.kbuf.shape[:2], more, self.kbuf.shape[3])), 2)
                self.vbuf = torch.cat((self.vbuf, self.vbuf.new_zeros(*self.vbuf.shape[:2], more, self.vbuf.shape[3])), 2)
            self.kbuf[:, :, self.length:end] = key_states
            self.vbuf[:, :, self.length:end] = value_states
            self.length = end
            self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.length + query_length, 0

        def select(self, rows: Any, start: int) -> None:
            """Keep batch rows ``rows`` and drop the first ``start`` positions (padding of every kept row)."""
            self.kbuf, self.vbuf = self.kbuf[rows, :, start:], self.vbuf[rows, :, start:]
            self.length -= start
            self.keys, self.values = self.kbuf[:, :, :self.length], self.vbuf[:, :, :self.length]

    return GrowingLayer

