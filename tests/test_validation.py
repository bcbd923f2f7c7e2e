"""Tests of the validation suite (fastkda.validation): it passes a correct implementation and fails broken ones.

The broken implementations live in ``tests/broken_impls.py``; each wraps the correct reference and breaks one
thing. Every test here asserts not only that the suite fails them but on which case and criterion.
All runs use the CPU and ``size="small"``.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import fastkda
from fastkda.validation import cases, metrics, quick_check, run_case, run_suite, suite
from fastkda.validation.__main__ import main
from fastkda.validation.metrics import DEFAULT, SLOW_DECAY, Thresholds
from fastkda.validation.suite import (CRITERIA, case_seed, compute_truth, fla_fwd, reference_fwd, resolve_impl,
                                      window_sensitivity)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # the broken implementations are addressed as tests.broken_impls (also by the CLI)
    sys.path.insert(0, REPO)

from tests import broken_impls as broken  # noqa: E402
QUICK_LENS = [300, 17, 700]


def one_case(tier: str, name: str, size: str = "small") -> cases.Case:
    found = [c for c in cases.tier_cases(tier, size) if c.name == name]
    assert found, f"no case {tier}/{name}"
    return found[0]


def run_one(impl, tier: str, name: str, seed: int = 12345):
    return run_case(impl, one_case(tier, name), device="cpu", seed=seed)


# ---- metrics on hand-made tensors ------------------------------------------------------------------------


def test_relative_l2_hand_made():
    ref = torch.tensor([3.0, 4.0])                          # norm 5
    assert metrics.relative_l2(ref.clone(), ref) == 0.0
    assert metrics.relative_l2(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert metrics.relative_l2(torch.tensor([0.0, 0.0]), ref) == pytest.approx(1.0)
    # bf16 input is compared in float64
    assert metrics.relative_l2(ref.bfloat16(), ref.double()) == 0.0
    # non-finite -> inf; zero reference with nonzero error and no floor -> inf; both zero -> 0
    assert metrics.relative_l2(torch.tensor([float("nan"), 4.0]), ref) == math.inf
    assert metrics.relative_l2(torch.tensor([float("inf"), 4.0]), ref) == math.inf
    assert metrics.relative_l2(torch.ones(2), torch.zeros(2)) == math.inf
    assert metrics.relative_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    with pytest.raises(ValueError):
        metrics.relative_l2(torch.zeros(3), torch.zeros(2))


def test_floor_only_matters_for_near_zero_references():
    ref = torch.full((100,), 1e-13, dtype=torch.float64)    # a state decayed to ~1e-13
    x = torch.zeros(100)
    floor = metrics.magnitude_floor(1.0, 100)               # 1e-6 * 1 * sqrt(100) = 1e-5
    assert floor == pytest.approx(1e-5)
    assert metrics.relative_l2(x, ref) == pytest.approx(1.0)               # relative: total loss
    assert metrics.relative_l2(x, ref, floor) == pytest.approx(1e-12 / 1e-5)  # against the floor: negligible
    # a reference above the floor is judged fully relative
    big = torch.ones(100, dtype=torch.float64)
    assert metrics.relative_l2(big * 1.01, big, floor) == pytest.approx(0.01)
    # the floor scales with the inputs' scale and sqrt(numel)
    assert metrics.magnitude_floor(1e-3, 400) == pytest.approx(1e-6 * 1e-3 * 20)


def test_token_error_sees_one_bad_token():
    torch.manual_seed(0)
    ref = torch.randn(1, 4000, 2, 8, dtype=torch.float64)
    out = ref.clone()
    typical = ref.reshape(4000, -1).norm(dim=1).square().mean().sqrt()
    bump = torch.zeros(16, dtype=torch.float64)
    bump[0] = 0.2 * typical
    out[0, 500] += bump.reshape(2, 8)
    assert metrics.token_error(out, ref) == pytest.approx(0.2)
    assert metrics.relative_l2(out, ref) < 5e-3        # the L2 error over all tokens hides it ...
    assert metrics.token_error(out, ref) > metrics.TOKEN_THRESHOLD  # ... the per-token criterion does not
    assert metrics.worst_token(out, ref) == 500
    assert metrics.token_error(ref.clone(), ref) == 0.0
    out[0, 3, 1, 2] = float("nan")
    assert metrics.token_error(out, ref) == math.inf
    assert metrics.worst_token(out, ref) == 3
    empty = torch.zeros(1, 0, 2, 8)
    assert metrics.token_error(empty, empty) == 0.0


def test_dominant_head_names_the_head_that_holds_the_output():
    ref = torch.ones(1, 4, 3, 2)
    ref[:, :, 2] *= 3.0                                      # head 2: 9 / 11 of the squared norm
    out = ref.clone()
    out[:, :, 2] *= 1.01                                     # its own error: 1%
    head, share, err = metrics.dominant_head(out, ref)
    assert head == 2 and share == pytest.approx(9 / 11) and err == pytest.approx(0.01)


def test_out_failure_names_the_dominant_head():
    def one_head_off(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                     final_state=None, cu_seqlens=None):
        reference_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=initial_state,
                      final_state=final_state, cu_seqlens=cu_seqlens)
        out[:, :, 0] *= 1.05                                 # value head 0 wrong by 5%
    r = run_one(one_head_off, "random", "normal_fixed_batch_d128")
    assert not r.passed and "out" in r.failed
    assert "value head" in r.message and "its own rel L2" in r.message


def test_finiteness_and_rms():
    assert metrics.is_finite(torch.ones(3)) and metrics.is_finite(None) and metrics.is_finite(torch.ones(0))
    assert not metrics.is_finite(torch.tensor([1.0, float("nan")]))
    assert not metrics.is_finite(torch.tensor([1.0, float("-inf")]))
    assert metrics.rms(torch.tensor([3.0, 4.0])) == pytest.approx(math.sqrt(12.5))
    assert metrics.rms(None) == 0.0


def test_thresholds_are_capped_and_only_stress_cases_relax_them():
    with pytest.raises(ValueError):
        Thresholds(out=2e-2)
    assert DEFAULT.out == DEFAULT.state == 5e-3 and DEFAULT.token == 5e-2 and not DEFAULT.token_own_norm
    assert SLOW_DECAY.out <= metrics.MAX_THRESHOLD and SLOW_DECAY.state <= metrics.MAX_THRESHOLD
    outlier, heavy = metrics.OUTLIER_TOKENS, metrics.HEAVY_TAILS
    for own_norm in (outlier, heavy):      # the same bounds, only measured against a token's own norm too
        assert (own_norm.out, own_norm.state, own_norm.token) == (DEFAULT.out, DEFAULT.state, DEFAULT.token)
        assert own_norm.token_own_norm
    for size in cases.SIZES:
        for tier in cases.TIERS:
            for case in cases.tier_cases(tier, size):
                if case.name == "student_t_gva_varlen":
                    assert case.thresholds == heavy
                elif tier in ("quick", "random", "varlen", "model"):
                    assert case.thresholds == DEFAULT, case.name
                elif case.thresholds == outlier:
                    assert case.name in ("beta_logits_minus_30", "v_times_1e-3", "initial_state_1e3"), case.name
                elif case.thresholds != DEFAULT:
                    assert case.thresholds == SLOW_DECAY, case.name
                    assert tier == "long" or "slow_decay" in case.name or "-0.01" in case.name, case.name


# ---- ground truth ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tier,name", [("extreme", "gate_near_zero_slow_decay"),
                                       ("extreme", "gate_pinned_at_lower_bound"),
                                       ("varlen", "chunk_edge_lengths"),
                                       ("long", "slow_decay_long_memory")])
def test_chunked_float64_truth_agrees_with_recurrence(tier, name):
    x = one_case(tier, name).build(torch.Generator().manual_seed(7))
    o_rec, s_rec, m1 = compute_truth(x, "recurrence")
    o_chk, s_chk, m2 = compute_truth(x, "chunked")
    assert (m1, m2) == ("recurrence", "chunked")
    assert metrics.relative_l2(o_chk, o_rec) < 1e-13
    assert metrics.relative_l2(s_chk, s_rec) < 1e-13


def test_case_inputs_replay_from_seed_and_fresh_seeds_differ():
    case = one_case("random", "normal_fixed_batch_d128")
    a = case.build(torch.Generator().manual_seed(case_seed(5, case.tier, case.name)))
    b = case.build(torch.Generator().manual_seed(case_seed(5, case.tier, case.name)))
    c = case.build(torch.Generator().manual_seed(case_seed(6, case.tier, case.name)))
    assert torch.equal(a.q, b.q) and torch.equal(a.initial_state, b.initial_state)
    assert not torch.equal(a.q, c.q)
    assert case_seed(5, "random", "x") != case_seed(5, "random", "y")


def test_quick_inputs_follow_the_benchmark_protocol():
    x = cases.benchmark_inputs(torch.Generator().manual_seed(0), [4096], H=2, D=128)
    assert x.cu_seqlens is None and tuple(x.q.shape) == (1, 4096, 2, 128)
    assert x.q.dtype == x.k.dtype == x.v.dtype == x.g.dtype == x.beta.dtype == torch.bfloat16
    assert x.A_log.dtype == x.dt_bias.dtype == torch.float32 and tuple(x.dt_bias.shape) == (2, 128)
    assert x.initial_state.dtype == torch.float32 and tuple(x.initial_state.shape) == (1, 2, 128, 128)
    assert x.lower_bound == -5.0 and x.scale == pytest.approx(128 ** -0.5)
    assert 0.09 < metrics.rms(x.initial_state) < 0.11 and 0.95 < metrics.rms(x.q) < 1.05
    assert 0 <= float(x.A_log.min()) and float(x.A_log.max()) <= 1
    packed = cases.benchmark_inputs(torch.Generator().manual_seed(0), [5, 0, 3], H=1, D=64)
    assert packed.cu_seqlens.tolist() == [0, 5, 5, 8] and packed.state_shape == (3, 1, 64, 64)


def test_model_tier_is_synthetic_with_trained_statistics():
    for case in cases.tier_cases("model", "small"):
        x = case.build(torch.Generator().manual_seed(3))
        assert abs(float(x.log_decay().mean()) - cases.MODEL_TARGET_LOG_DECAY) < 0.1
        assert float(torch.sigmoid(x.beta.float()).mean()) > 0.7       # skewed: most writes strong
        channel_rms = x.v.float().square().mean(dim=(0, 1)).sqrt()      # [HV, V]
        assert int((channel_rms > 5).sum()) == cases.MODEL_HEAVY_CHANNELS * x.v.shape[2]
        assert "SYNTHETIC" in case.notes(x) and "not real model data" in case.notes(x)
        assert "SYNTHETIC" in case.about


def test_long_case_end_depends_on_its_start():
    case = one_case("long", "slow_decay_long_memory")
    x = case.build(torch.Generator().manual_seed(11))
    assert max(x.seq_lens) >= 4096
    assert float(x.log_decay().abs().max()) < 1e-12                     # g = -50: nothing decays
    ref_out, ref_state, _ = compute_truth(x, case.truth)
    for window in (32, 1024):
        state_err, token_err = window_sensitivity(x, ref_out, ref_state, window)
        assert state_err > 10 * case.thresholds.state, window
        assert token_err > 5 * case.thresholds.token, window


# ---- a correct implementation passes -------------------------------------------------------------------


@pytest.mark.parametrize("tier", cases.TIERS)
def test_reference_passes_every_tier(tier):
    report = run_suite(reference_fwd, tiers=tier, device="cpu", size="small")
    assert report.passed, report.table()
    assert len(report.results) == len(cases.tier_cases(tier, "small"))
    if tier == "long":
        assert all("window would score" in r.notes for r in report.results)
        assert all(r.truth == "chunked" for r in report.results)
    if tier == "model":
        assert all("SYNTHETIC" in r.notes for r in report.results)


def test_fastkda_passes_quick_check_on_cpu():
    for lens, D, HV in (([300], 128, None), ([40, 0, 77], 64, 4)):
        r = quick_check(fastkda.fwd, seq_lens=lens, H=2, D=D, HV=HV, device="cpu")
        assert r.passed, r.message
        assert r.tier == "quick" and r.seed >= 0 and isinstance(r.as_dict(), dict)


def test_suite_poisons_outputs_before_the_call():
    seen = {}

    def probe(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
              final_state=None, cu_seqlens=None):
        seen["out"] = bool(torch.isnan(out).all())
        seen["state"] = bool(torch.isnan(final_state).all())
        seen["initial_state"] = initial_state is not None
        reference_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
                      cu_seqlens)

    assert run_one(probe, "varlen", "single_token_sequences").passed
    assert seen == {"out": True, "state": True, "initial_state": True}
    assert run_one(probe, "varlen", "empty_no_initial_state").passed
    assert seen["initial_state"] is False


# ---- broken implementations fail, on the expected case and criterion ---------------------------------------


def test_window_of_32_tokens_fails_the_long_tier():
    report = run_suite(broken.window_32, tiers="long", size="small", cases=["slow_decay_long_memory"])
    (r,) = report.results
    assert not report.passed
    assert {"out", "state", "token"} <= set(r.failed)
    assert r.out_err > 10 * r.thresholds["out"] and r.state_err > 10 * r.thresholds["state"]


def test_window_of_1024_tokens_fails_the_long_tier():
    r = run_one(broken.window_1024, "long", "slow_decay_long_memory")
    assert not r.passed and {"out", "state", "token"} <= set(r.failed)


def test_exp2_gate_fails_quick_and_random():
    r = quick_check(broken.exp2_gate, seq_lens=QUICK_LENS, H=2)
    assert not r.passed and {"out", "state"} <= set(r.failed)
    r = run_one(broken.exp2_gate, "random", "uniform_varlen_d64_bf16_state")
    assert not r.passed and {"out", "state"} <= set(r.failed)


def test_unwritten_partial_chunk_fails_varlen():
    r = run_one(broken.skips_partial_chunk, "varlen", "chunk_edge_lengths")
    assert not r.passed and "nonfinite" in r.failed and "out has" in r.message
    assert "state" not in r.failed                               # its final state is right


def test_ignored_initial_state_fails():
    r = run_one(broken.ignores_initial_state, "extreme", "initial_state_1e3")
    assert not r.passed and {"out", "token"} <= set(r.failed)
    r = run_one(broken.ignores_initial_state, "varlen", "empty_first_middle_last")
    assert not r.passed and "state" in r.failed                  # empty sequences must carry it through
    r = run_one(broken.ignores_initial_state, "extreme", "beta_minus_30_slow_decay")
    assert not r.passed and "state" in r.failed


def test_replayed_outputs_pass_a_fixed_seed_and_fail_fresh_seeds():
    replay = broken.ReplayingImpl()
    first = quick_check(replay, seq_lens=QUICK_LENS, H=2, seed=424242)   # records (correctly) on seed X
    again = quick_check(replay, seq_lens=QUICK_LENS, H=2, seed=424242)   # replays: a fixed seed is fooled
    assert first.passed and again.passed
    fresh = quick_check(replay, seq_lens=QUICK_LENS, H=2)                # fresh seed: caught
    assert fresh.seed != 424242
    assert not fresh.passed and {"out", "state", "token"} <= set(fresh.failed)
    report = run_suite(replay, tiers="random", size="small", cases=["normal_fixed_batch_d128"])
    report_fresh = run_suite(replay, tiers="random", size="small", cases=["normal_fixed_batch_d128"])
    assert report.run_seed != report_fresh.run_seed
    assert not report_fresh.passed


def test_one_bad_token_fails_only_the_per_token_criterion():
    r = quick_check(broken.one_token_off, seq_lens=QUICK_LENS, H=2)
    assert not r.passed and r.failed == ["token"]
    assert r.out_err <= r.thresholds["out"]
    assert "token 150 of sequence 0" in r.message                # where: the middle of the first sequence


def test_nan_in_outputs_fails():
    r = quick_check(broken.one_nan, seq_lens=QUICK_LENS, H=2)
    assert not r.passed and r.failed[0] == "nonfinite" and math.isinf(r.out_err)
    assert "out has 1 non-finite" in r.message


def test_unwritten_empty_sequence_state_fails():
    r = run_one(broken.skips_empty_sequences, "varlen", "empty_first_middle_last")
    assert not r.passed and r.failed[0] == "nonfinite" and "final_state" in r.message


def test_l2_norm_eps_outside_the_square_root_fails_tiny_k_rows():
    r = run_one(broken.l2norm_eps_outside_sqrt, "extreme", "tiny_k_rows")
    assert not r.passed and {"out", "state"} <= set(r.failed)
    assert run_one(broken.l2norm_eps_outside_sqrt, "extreme", "zero_k_rows").passed  # only tiny rows tell


def test_floor_excuses_only_negligible_states():
    # v x 1e-3: a small but meaningful state -- judged relative, a zero state fails
    r = run_one(broken.zero_final_state, "extreme", "v_times_1e-3")
    assert not r.passed and r.failed == ["state"]
    # beta logits -30 under fast decay: the true final state is ~1e-13 of the inputs' scale, below the floor
    case = one_case("extreme", "beta_logits_minus_30")
    x = case.build(torch.Generator().manual_seed(12345))
    _, ref_state, _ = compute_truth(x)
    assert metrics.rms(ref_state) < 1e-9 * x.input_scale()
    assert run_one(broken.zero_final_state, "extreme", "beta_logits_minus_30").passed


def test_crash_and_input_corruption_fail():
    r = quick_check(broken.raises, seq_lens=[64], H=1, D=64)
    assert not r.passed and r.failed == ["raised"] and "deliberate failure" in r.message
    r = quick_check(broken.scribbles_on_inputs, seq_lens=[64], H=1, D=64)
    assert not r.passed and r.failed == ["modified_input"]
    assert set(CRITERIA) >= {"raised", "modified_input", "wrote_outside", "nondeterministic", "nonfinite", "out",
                             "state", "token"}


def test_writes_outside_the_outputs_fail():
    r = quick_check(broken.writes_one_row_past_out, seq_lens=[64], H=1, D=64)
    assert not r.passed and r.failed == ["wrote_outside"]
    assert "wrote outside out: 64 of the" in r.message and "64 element(s) past its end" in r.message
    r = quick_check(broken.writes_before_final_state, seq_lens=[40, 24], H=1, D=64)
    assert not r.passed and r.failed == ["wrote_outside"]
    assert "wrote outside final_state: 1 of the" in r.message and "nearest 1 element(s) before its start" in r.message


def test_repeated_calls_must_give_the_same_bits():
    case = cases.quick_case([64], H=1, D=64)
    broken.differs_on_repeat.calls = 0
    assert run_case(broken.differs_on_repeat, case, seed=3).passed        # one call: accurate, nothing to compare
    broken.differs_on_repeat.calls = 0
    r = run_case(broken.differs_on_repeat, case, seed=3, calls=3)
    assert not r.passed and r.failed == ["nondeterministic"]
    assert r.message.startswith("out of call 2 differs from call 1's in 1 of 4096 element(s)")
    assert run_case(reference_fwd, case, seed=3, calls=3).passed          # deterministic: passes every repeat
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="calls"):
            run_case(reference_fwd, case, seed=3, calls=bad)
    broken.differs_on_repeat.calls = 0                                  # the benchmark's gate repeats by default
    r = quick_check(broken.differs_on_repeat, seq_lens=[64], H=1, D=64)
    assert not r.passed and r.failed == ["nondeterministic"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_guarded_outputs_are_aligned_nan_views_whose_guards_see_any_write(dtype):
    buf, view = suite._guarded_nan((2, 3, 5), dtype, torch.device("cpu"))
    assert view.is_contiguous() and view.shape == (2, 3, 5) and bool(view.isnan().all())
    assert view.data_ptr() % 16 == 0 and view.data_ptr() == buf.data_ptr() + suite.GUARD_ELEMENTS * buf.element_size()
    assert suite._guard_message("out", buf, view.numel()) is None
    view.zero_()                                          # writes inside the view are the implementation's business
    assert suite._guard_message("out", buf, view.numel()) is None
    # the first guard element, the last before the view, the last after it (the guards hold -64..63)
    for index, value in ((0, 0.0), (suite.GUARD_ELEMENTS - 1, math.nan), (-1, 64.0)):
        b = buf.clone()
        b[index] = value
        assert suite._guard_message("out", b, view.numel()) is not None


# ---- report, registry, command line -----------------------------------------------------------------------


def test_report_table_and_json():
    report = run_suite(broken.one_nan, tiers="quick", size="small", seed=99)
    assert not report.passed and report.run_seed == 99
    table = report.table()
    for word in ("tier", "case", "seed", "out err", "state err", "token err", "FAIL", "failures:",
                 str(report.results[0].seed)):
        assert word in table
    data = json.loads(report.to_json())
    assert data["passed"] is False and data["run_seed"] == 99
    assert data["results"][0]["out_err"] == "inf" and data["results"][0]["failed"][0] == "nonfinite"


def test_resolve_impl():
    from fastkda.validation.suite import fastkda_fwd
    assert resolve_impl("reference") is reference_fwd
    assert resolve_impl("fastkda") is fastkda_fwd
    assert resolve_impl("fla") is fla_fwd
    assert resolve_impl("tests.broken_impls:exp2_gate") is broken.exp2_gate
    for bad in ("nonsense", "tests.broken_impls:missing", "no_such_module_xyz:f"):
        with pytest.raises(ValueError):
            resolve_impl(bad)


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla not installed")
def test_fla_wrapper_arguments_match_fla_signature():
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    from fla.ops.kda import chunk_kda
    params = inspect.signature(chunk_kda).parameters
    for name in ("scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel", "use_gate_in_kernel",
                 "use_beta_sigmoid_in_kernel", "safe_gate", "lower_bound", "state_v_first", "cu_seqlens"):
        assert name in params, name
    assert "A_log" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def test_cli_exit_status(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["--impl", "tests.broken_impls:exp2_gate", "--tier", "quick", "--json", str(path)]) == 1
    assert json.loads(path.read_text())["passed"] is False
    assert main(["--impl", "reference", "--tier", "quick", "--seed", "7", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "run seed=7" in printed and "PASS" in printed
    assert main(["--impl", "no_such_impl", "--tier", "quick"]) == 1
    assert main(["--impl", "reference", "--tier", "varlen", "--case", "single_token_sequences"]) == 0
    assert main(["--impl", "reference", "--tier", "quick", "--calls", "2", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["calls"] == 2


def test_cli_as_module_subprocess():
    cmd = [sys.executable, "-m", "fastkda.validation", "--impl", "tests.broken_impls:ignores_initial_state",
           "--tier", "varlen", "--case", "empty_first_middle_last", "--device", "cpu", "--seed", "3"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "--seed 3" in proc.stdout


def test_token_error_against_own_norm_still_catches_a_wrong_large_token():
    from fastkda.validation.metrics import token_error
    ref = torch.ones(1, 100, 1, 4, dtype=torch.float64)
    ref[0, 0] *= 20.0                                   # one token 20x the others, like an initial-state echo
    out = ref.clone()
    out[0, 0] *= 1.03                                   # 3% off on the big token: quantisation-sized
    assert token_error(out, ref) > 5e-2                 # RMS yardstick: fails
    assert token_error(out, ref, own_norm=True) < 5e-2  # own-norm yardstick: passes
    out[0, 0] = ref[0, 0] * 1.10                        # 10% off: wrong, whatever the yardstick
    assert token_error(out, ref, own_norm=True) > 5e-2
    out = ref.clone()
    out[0, 5] *= 1.10                                   # a small token 10% off is judged as before
    assert token_error(out, ref, own_norm=True) == pytest.approx(token_error(out, ref))
