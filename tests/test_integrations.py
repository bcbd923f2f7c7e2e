"""fastkda as a backend of fla's chunk_kda dispatch (skipped when fla is not installed)."""


import pytest
import torch

import fastkda
from fastkda.integrations import fla as fla_integration

from conftest import HAS_CUDA

fla_kda = pytest.importorskip("fla.ops.kda")


def inputs(device, HV=2, T=40, K=64):
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(1, T, HV, K, generator=gen).to(torch.bfloat16).to(device) for _ in range(4)]
    beta = torch.randn(1, T, HV, generator=gen).to(torch.bfloat16).to(device)
    kw = dict(A_log=torch.rand(HV, generator=gen).to(device), dt_bias=torch.rand(HV * K, generator=gen).to(device),
              lower_bound=-5.0, safe_gate=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, state_v_first=True, output_final_state=True,
              cu_seqlens=torch.tensor([0, 15, 40], dtype=torch.long, device=device))
    return (*x, beta), kw


@pytest.fixture
def registered():
    assert fastkda.register_fla_backend()
    yield
    fastkda.unregister_fla_backend()


def test_register_and_unregister():
    fastkda.register_fla_backend()
    assert fla_integration.BACKEND_TYPE in fla_integration.registry_of_chunk_kda()._backends
    fastkda.unregister_fla_backend()
    assert fla_integration.BACKEND_TYPE not in fla_integration.registry_of_chunk_kda()._backends


def test_verifier_declines_what_fastkda_cannot_serve(registered, monkeypatch):
    monkeypatch.setattr(fla_integration, "_served_device", lambda device: True)
    args, kw = inputs("cpu")
    with torch.inference_mode():
        assert fla_integration.active_backend_for(*args, **kw) == "fastkda"
        assert fla_integration.active_backend_for(*args, **{**kw, "lower_bound": None}) != "fastkda"
        assert fla_integration.active_backend_for(*args, **{**kw, "allow_neg_eigval": True}) != "fastkda"
        huge = [torch.empty(1, 180_000, 96, 128, dtype=torch.bfloat16, device="meta") for _ in range(4)]
        huge.append(torch.empty(1, 180_000, 96, dtype=torch.bfloat16, device="meta"))
        huge_kw = {**kw, "A_log": torch.empty(96, device="meta"), "dt_bias": torch.empty(96 * 128, device="meta"),
                   "cu_seqlens": None}
        assert fla_integration.active_backend_for(*huge, **huge_kw) != "fastkda"   # beyond 32-bit offsets
        monkeypatch.setenv("FLA_FASTKDA", "0")
        assert fla_integration.active_backend_for(*args, **kw) != "fastkda"
    monkeypatch.delenv("FLA_FASTKDA")
    # with grad mode on, fla keeps the call (fastkda is forward-only)
    assert fla_integration.active_backend_for(*args, **kw) != "fastkda"


def test_fla_chunk_kda_reaches_fastkda(registered, monkeypatch):
    device = "cuda" if HAS_CUDA else "cpu"
    if not HAS_CUDA:  # on the CPU, let the dispatch through to fastkda's reference path
        monkeypatch.setattr(fla_integration, "_served_device", lambda device: True)
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    calls = []
    real_forward = fastkda.api.forward
    monkeypatch.setattr(fastkda.api, "forward", lambda *a, **k: calls.append(1) or real_forward(*a, **k))
    args, kw = inputs(device)
    with torch.inference_mode():
        o, s = fla_kda.chunk_kda(*args, **kw)
    assert calls, "fla's chunk_kda did not reach fastkda"
    monkeypatch.setattr(fastkda.api, "forward", real_forward)
    with torch.inference_mode():
        o_ref, s_ref = fastkda.chunk_kda(*args, **kw)
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)
