"""Attention as an accelerator runs it: a fused kernel the CPU has none of (``sdpa_kernel``).

By default the pretend device runs ``scaled_dot_product_attention`` as its composite does for a
backend with no attention kernel of its own: the math attention, matrix products and a softmax, each
an operator the CPU has too. A real accelerator runs one fused kernel instead (CUDA its flash
attention for unmasked attention), which the CPU cannot run: whatever checks a device's operators
against the CPU's must replay that kernel some other way, or say it could not. ``"sdpa_kernel"``
makes the pretend device do the same, under ``torch.inference_mode()`` (as the probe and the debug
tools run; outside it autograd takes the composite apart before any backend sees it):

- ``"flash"``: attention with no mask and no dropout runs as
  ``aten::_scaled_dot_product_flash_attention``, with CUDA's outputs (the output, its logsumexp,
  then sequence offsets, lengths, random-number state and a debug mask); the rest as the math
  attention, as CUDA's selection falls back;
- ``"own"``: attention with no dropout runs as ``pretend::attention``, a kernel registered for this
  device alone: torch knows its name, nothing but this device can run it (an out-of-tree backend's
  own kernels are such).

``wrong_ops`` can name either. The choice is made where the dispatcher would make it: this module's
kernel is scaled_dot_product_attention's decomposition (``install``), which the backend and every
dispatch mode over the device (the census, the localiser) take it apart with; the fused kernels'
work is done on the CPU data underneath (``KERNELS``, which ``tensor.run`` calls instead of the
CPU's missing kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .config import NAME, SDPA_KERNELS

#: ``pretend::attention``: the device's own attention kernel, defined once per process (its
#: namespace is this backend's; torch has no kernel of it for any other device).
_LIBRARY = torch.library.Library("pretend", "DEF")
_LIBRARY.define(
    "attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, bool "
    "is_causal=False, float? scale=None, bool enable_gqa=False) -> Tensor"
)
OWN = torch.ops.pretend.attention.default
FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _flash(
    query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    """CUDA's flash attention's outputs, on the CPU data underneath: the CPU's flash attention
    gives the output and its logsumexp; beside them what CUDA returns for a dense batch (empty
    sequence offsets, the query and key lengths, an empty random-number state, no debug mask)."""
    output, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, scale=scale
    )
    offsets = torch.empty(0, dtype=torch.int32)
    state = torch.empty(0, dtype=torch.int64)
    return (
        output,
        logsumexp,
        offsets,
        offsets.clone(),
        query.shape[-2],
        key.shape[-2],
        state,
        state.clone(),
        torch.empty(0, dtype=query.dtype),
    )


def _own(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """``pretend::attention`` on the CPU data underneath: the attention the CPU computes from the
    same inputs."""
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa
    )


#: The fused kernels' work on the CPU data (``tensor.run`` calls these where the CPU has no kernel
#: of its own).
KERNELS: dict[Any, Callable[..., Any]] = {FLASH: _flash, OWN: _own}


def _heads_repeated(query, key, value):
    """Key and value with as many heads as the query (grouped-query attention): flash attention
    wants them equal."""
    groups = query.shape[-3] // key.shape[-3]
    if groups == 1:
        return key, value
    return key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)


def install(choice: str) -> None:
    """Run ``scaled_dot_product_attention`` on the device as ``choice`` (one of
    ``config.SDPA_KERNELS``; the math attention needs nothing installed): its decomposition, for
    a query on the device, becomes the fused kernel."""
    if choice == SDPA_KERNELS[0]:
        return

    def decomposition(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        if query.device.type == NAME and not dropout_p:
            if choice == "own":
                return OWN(query, key, value, attn_mask, is_causal, scale, enable_gqa)
            if attn_mask is None:
                key, value = _heads_repeated(query, key, value)
                return FLASH(query, key, value, 0.0, is_causal, False, scale=scale)[0]
        return SDPA._op_dk(
            torch._C.DispatchKey.CompositeImplicitAutograd,
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    SDPA.py_impl(torch._C.DispatchKey.CompositeImplicitAutograd)(decomposition)
