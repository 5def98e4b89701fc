"""Exact enumeration of one verification step: over every draft outcome and every
accept/reject branch, the tokens the verifier emits are distributed exactly as the target's.

The verifier is driven through its real code path: each branch is forced with uniforms on the
right side of the acceptance threshold, and the distribution it samples the emitted token
from is read back from its verdict."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec.sampling import SamplingParams, probabilities
from specdec.verify import residual, verify

V = 5
K = 2


def random_dist(gen, shape, sparsity=0.0):
    x = torch.rand(*shape, V, generator=gen, dtype=torch.float64) + 0.05
    if sparsity:
        x = x * (torch.rand(*shape, V, generator=gen, dtype=torch.float64) > sparsity)
        x[..., 0] += 0.01  # keep at least one token alive
    return x / x.sum(-1, keepdim=True)


def branches(ratios: list[float]):
    """(first rejected position or None, probability, uniforms forcing that branch)."""
    for j in range(len(ratios) + 1):
        weight, us = 1.0, []
        for i in range(j):
            weight *= ratios[i]
            us.append(0.0)  # 0 < ratio: accepted
        if j < len(ratios):
            weight *= 1.0 - ratios[j]
            us.append(ratios[j])  # not (ratio < ratio): rejected
            us += [0.0] * (len(ratios) - j - 1)
        if weight > 0:
            yield (j if j < len(ratios) else None), weight, us


def two_token_distribution(p1, p2, q1, q2):
    """Exact P(first two emitted tokens) of one SD round with K=2 (continued by plain sampling
    from p when the round emits a single token).

    p1 [V], p2 [V,V] (p2[a] = p(. | a)), p3 [V,V,V] unused beyond two tokens; q likewise."""
    out = torch.zeros(V, V, dtype=torch.float64)
    for d1, d2 in itertools.product(range(V), range(V)):
        w_draft = q1[d1] * q2[d1, d2]
        if w_draft == 0:
            continue
        p = torch.stack([p1, p2[d1], torch.full((V,), 1.0 / V, dtype=torch.float64)])[None]
        q = torch.stack([q1, q2[d1]])[None]
        draft = torch.tensor([[d1, d2]])
        ratios = [
            min(1.0, float(p[0, 0, d1] / q[0, 0, d1])),
            min(1.0, float(p[0, 1, d2] / q[0, 1, d2])),
        ]
        for first_reject, w_branch, us in branches(ratios):
            verdict = verify(
                p,
                q,
                draft,
                torch.tensor([K]),
                torch.tensor([us], dtype=torch.float64),
                torch.zeros(1),
            )
            n = int(verdict.num_accepted[0])
            assert n == (K if first_reject is None else first_reject)
            dist = verdict.next_dist[0]
            w = w_draft * w_branch
            if n == 0:  # emitted t1 ~ residual; the next token then comes from p2(. | t1)
                out += w * dist[:, None] * p2
            elif n == 1:  # emitted d1, then t2 ~ residual/position 2
                out[d1] += w * dist
            else:  # emitted d1, d2 (then a bonus token we do not look at)
                out[d1, d2] += w
    return out


def target_two_token(p1, p2):
    return p1[:, None] * p2


@pytest.mark.parametrize("seed", range(6))
def test_sd_step_distribution_equals_target(seed):
    gen = torch.Generator().manual_seed(seed)
    p1, p2 = random_dist(gen, ()), random_dist(gen, (V,))
    q1, q2 = random_dist(gen, ()), random_dist(gen, (V,))
    got = two_token_distribution(p1, p2, q1, q2)
    torch.testing.assert_close(got, target_two_token(p1, p2), atol=1e-12, rtol=0)


@pytest.mark.parametrize("seed", range(4))
def test_q_with_mass_where_p_has_none(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    p1, p2 = random_dist(gen, (), sparsity=0.5), random_dist(gen, (V,), sparsity=0.5)
    q1, q2 = random_dist(gen, ()), random_dist(gen, (V,))  # full support
    got = two_token_distribution(p1, p2, q1, q2)
    torch.testing.assert_close(got, target_two_token(p1, p2), atol=1e-12, rtol=0)


@pytest.mark.parametrize("seed", range(4))
def test_point_mass_draft_like_ngram(seed):
    gen = torch.Generator().manual_seed(200 + seed)
    p1, p2 = random_dist(gen, ()), random_dist(gen, (V,))
    q1 = torch.zeros(V, dtype=torch.float64)
    q1[seed % V] = 1.0
    q2 = torch.zeros(V, V, dtype=torch.float64)
    q2[:, (seed + 2) % V] = 1.0
    got = two_token_distribution(p1, p2, q1, q2)
    torch.testing.assert_close(got, target_two_token(p1, p2), atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.2, top_p=0.6),
        SamplingParams(temperature=0.5, top_k=4, top_p=0.8),
    ],
    ids=["topk", "topp", "both"],
)
def test_with_the_shared_sampling_transform(params):
    """p and q both come from logits through the same transform (top-k/top-p zero out tokens)."""
    gen = torch.Generator().manual_seed(7)

    def dist(shape):
        logits = torch.randn(*shape, V, generator=gen, dtype=torch.float64) * 2
        flat = logits.reshape(-1, V)
        return probabilities(flat, [params] * flat.shape[0]).reshape(*shape, V)

    p1, p2, q1, q2 = dist(()), dist((V,)), dist(()), dist((V,))
    assert (p1 == 0).any() and (q1 == 0).any()  # the transforms really cut tokens
    got = two_token_distribution(p1, p2, q1, q2)
    torch.testing.assert_close(got, target_two_token(p1, p2), atol=1e-12, rtol=0)


def test_greedy_is_accept_while_equal():
    def onehot(i):
        t = torch.zeros(V, dtype=torch.float64)
        t[i] = 1
        return t

    p = torch.stack([onehot(3), onehot(1), onehot(4)])[None]
    for draft, want_n, want_tok in [([3, 1], 2, 4), ([3, 2], 1, 1), ([0, 1], 0, 3)]:
        q = torch.stack([onehot(draft[0]), onehot(draft[1])])[None]
        v = verify(
            p, q, torch.tensor([draft]), torch.tensor([2]), torch.zeros(1, 2), torch.zeros(1)
        )
        assert (int(v.num_accepted[0]), int(v.next_token[0])) == (want_n, want_tok)


def test_residual_of_a_point_mass_is_the_formula():
    """The point-mass shortcut gives what normalize(max(0, p - q)) gives: for q spread, q a
    point mass elsewhere, q equal to p (zero mass: p)."""
    p = torch.zeros(3, 50)
    p[:, 7] = 1.0
    q = torch.softmax(torch.randn(3, 50), -1)
    q[1] = 0.0
    q[1, 3] = 1.0
    q[2] = p[2]
    for i in range(3):
        r = (p[i].double() - q[i].double()).clamp_min(0.0)
        want = r / r.sum() if r.sum() > 0 else p[i].double()
        assert torch.equal(residual(p[i : i + 1], q[i : i + 1])[0], want)


def test_rejected_token_is_never_the_replacement():
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        p, q = random_dist(gen, ()), random_dist(gen, ())
        for d in range(V):
            if p[d] < q[d]:  # d can be rejected
                assert residual(p, q)[d] == 0


def test_rows_are_independent_and_respect_their_k():
    gen = torch.Generator().manual_seed(9)
    p = random_dist(gen, (3, 4))
    q = random_dist(gen, (3, 3))
    draft = torch.tensor([[1, 2, 3], [0, 0, 0], [4, 4, 4]])
    k = torch.tensor([3, 0, 1])
    v = verify(p, q, draft, k, torch.zeros(3, 3), torch.full((3,), 0.5))
    assert (v.num_accepted <= k).all()
    assert int(v.num_accepted[1]) == 0
    torch.testing.assert_close(v.next_dist[1], p[1, 0])  # k = 0: a plain sample of p_1
