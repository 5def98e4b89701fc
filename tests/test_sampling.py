"""The logits -> probabilities transform, inverse-CDF sampling, parameter validation."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.sampling import (
    SamplingParams,
    SequenceRNG,
    first_argmax,
    point_masses,
    probabilities,
    sample,
)


def P(**kw):
    return SamplingParams(**kw)


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]], dtype=torch.float64)
    got = probabilities(logits, [P(temperature=0.5)])
    want = torch.softmax(logits / 0.5, -1)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_greedy_is_a_point_mass_on_the_first_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5]])
    got = probabilities(logits, [P(temperature=0)])
    assert got.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_first_argmax_is_torchs_argmax():
    """The numpy fast path: the first of tied maxima, NaN as torch has it, float64, a
    column slice (padding cut off), and a batch of positions."""
    x = torch.randn(3, 4, 1000)
    x[0, 1, [7, 900]] = 50.0  # a tie: the first wins
    x[1, 2, 5] = float("nan")
    for t in (x, x.double(), x[..., :600], x[:, 0]):
        assert torch.equal(first_argmax(t), t.argmax(-1))


def test_point_mass_rows_skip_the_cdf():
    """Rows that are all point masses sample their token for any uniform; a batch with one
    spread row takes the CDF for all (and stays exact); the greedy-only shortcut of
    ``probabilities`` gives the same one-hot rows as the mixed path."""
    logits = torch.randn(4, 64)
    greedy = probabilities(logits, [SamplingParams(temperature=0)] * 4)
    assert torch.equal(point_masses(greedy), logits.argmax(-1))
    for u in (0.0, 0.5, 0.999999):
        assert torch.equal(sample(greedy, [u] * 4), logits.argmax(-1))
    mixed = probabilities(logits, [SamplingParams(temperature=0)] * 3 + [SamplingParams()])
    assert torch.equal(mixed[:3], greedy[:3]) and point_masses(mixed) is None
    cdf = mixed[3].double().cumsum(0)
    want = int(torch.searchsorted(cdf, torch.tensor([0.37 * float(cdf[-1])]).double(), right=True))
    assert int(sample(mixed, [0.0, 0.0, 0.0, 0.37])[3]) == want


def test_top_k_keeps_k_most_probable():
    logits = torch.tensor([[0.1, 2.0, 1.0, 3.0, -1.0]], dtype=torch.float64)
    got = probabilities(logits, [P(top_k=2)])
    want = torch.zeros(5, dtype=torch.float64)
    want[[1, 3]] = torch.softmax(torch.tensor([2.0, 3.0], dtype=torch.float64), -1)
    torch.testing.assert_close(got[0], want, atol=1e-12, rtol=0)


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = probs.log()[None]
    got = probabilities(logits, [P(top_p=0.79)])[0]  # 0.5 + 0.3 reaches 0.79
    torch.testing.assert_close(got, torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))
    got = probabilities(logits, [P(top_p=0.81)])[0]  # needs the third token too
    torch.testing.assert_close(got, torch.tensor([0.5, 0.3, 0.15, 0], dtype=torch.float64) / 0.95)
    got = probabilities(logits, [P(top_p=0.1)])[0]  # always at least one
    assert got.tolist() == [1.0, 0, 0, 0]


def test_order_is_temperature_then_top_k_then_top_p():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
    got = probabilities(logits, [P(temperature=2.0, top_k=3, top_p=0.7)])[0]
    t = torch.softmax(logits[0, :3] / 2.0, -1)  # temperature, then top-3
    keep = 2 if t[0] < 0.7 else 1  # top-p over the top-k distribution
    want = torch.zeros(4, dtype=torch.float64)
    want[:keep] = t[:keep] / t[:keep].sum()
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_rows_use_their_own_params_and_padding_is_masked():
    logits = torch.randn(3, 10, dtype=torch.float64)
    logits[:, 8:] = 50.0  # padding rows beyond an 8-token tokenizer would win if not masked
    params = [P(temperature=0), P(top_k=3), P(temperature=0.7, top_p=0.9)]
    got = probabilities(logits, params, vocab_size=8)
    assert (got[:, 8:] == 0).all()
    for row, p in zip(range(3), params):
        alone = probabilities(logits[row : row + 1], [p], vocab_size=8)
        torch.testing.assert_close(got[row : row + 1], alone, atol=1e-12, rtol=0)
    torch.testing.assert_close(got.sum(-1), torch.ones(3, dtype=torch.float64))


def test_sample_is_inverse_cdf_and_never_picks_zero_probability():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]])
    us = [0.0, 0.2499, 0.25, 0.9999999999, 1 - 1e-17]
    got = [int(sample(probs, [u])[0]) for u in us]
    assert got == [1, 1, 3, 3, 3]


def test_sample_matches_distribution():
    from scipy import stats

    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(1, 12), -1)
    rng = SequenceRNG(123)
    n = 20000
    draws = sample(probs.expand(n, -1), rng.uniforms(n))
    counts = torch.bincount(draws, minlength=12).double()
    expected = probs[0].double() / probs[0].double().sum() * n
    p = stats.chisquare(counts.numpy(), expected.numpy()).pvalue
    assert p > 1e-3


def test_seeded_rng_reproducible_and_seeds_independent():
    assert SequenceRNG(7).uniforms(5) == SequenceRNG(7).uniforms(5)
    assert SequenceRNG(7).uniforms(5) != SequenceRNG(8).uniforms(5)
    assert SequenceRNG(None).uniforms(3) != SequenceRNG(None).uniforms(3)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
        ({"seed": "abc"}, "seed"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"prompt_logprobs": 2.0}, "prompt_logprobs"),
    ],
)
def test_invalid_sampling_values_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw)
