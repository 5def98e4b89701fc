"""The speculative-sampling verifier: accept, reject, resample, bonus.

Given the target's distributions p_1..p_{K+1} and the draft's q_1..q_K (both from the one
sampling transform), and draft tokens d_1..d_K with d_i ~ q_i:

    for i = 1..K:   accept d_i with probability min(1, p_i(d_i) / q_i(d_i))
    first reject:   emit a sample of r_i = normalize(max(0, p_i - q_i)), stop
    all accepted:   emit a bonus sample of p_{K+1}

Every round emits 1..K+1 tokens distributed exactly as sampling from p token by token.
Greedy is the special case of point masses: accept while d_i == argmax p_i, and the residual
of two different point masses is p's point mass, i.e. the target's argmax. An n-gram draft is
a point-mass q: accept with probability p_i(d_i), residual = p_i without d_i.
The verifier sees only probabilities and tokens, never a model or a cache.

Coupled rows (coupling.py) are judged by ``verify_coupled`` instead: the target's own choice
x_i = argmax p_i * w_i under the request's position-keyed weights w_i; accept while d_i == x_i,
emit x at the first difference or at the bonus position. No uniforms and no q are involved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.coupling import coupled_choice
from specdec.sampling import point_masses, sample


@dataclass
class Verdict:
    num_accepted: torch.Tensor  # [B] draft tokens accepted (0..k_b)
    next_token: torch.Tensor  # [B] the replacement (after a rejection) or the bonus token
    next_dist: torch.Tensor  # [B,V] the distribution next_token was drawn from


def acceptance_ratio(p_at: torch.Tensor, q_at: torch.Tensor) -> torch.Tensor:
    """min(1, p(d)/q(d)) at the drafted tokens (q(d) > 0 because d was drawn from q)."""
    p64, q64 = p_at.double(), q_at.double()
    return torch.where(q64 > 0, (p64 / q64.clamp_min(1e-300)).clamp(max=1.0), torch.zeros_like(p64))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) over the last dimension.

    Its mass is zero only if p <= q everywhere, i.e. p == q (up to rounding), in which case
    every draft token is accepted with probability 1 and the residual is never sampled; p is
    returned then so the function is total.

    Where every row of p is a point mass (greedy targets), the residual is p itself: max(0,
    p - q) is zero off p's token and 1 - q(token) >= 0 on it (zero mass: p again); taken
    without the five passes over the vocabulary in float64 (~1 ms a round at 152K)."""
    if point_masses(p) is not None:
        return p.double()
    r = (p.double() - q.double()).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(1e-300), p.double())


def verify(
    p: torch.Tensor,
    q: torch.Tensor,
    draft: torch.Tensor,
    k: torch.Tensor,
    u_accept: torch.Tensor,
    u_next: torch.Tensor,
) -> Verdict:
    """One verification step for a batch.

    p [B,K+1,V] target, q [B,K,V] draft, draft [B,K] tokens, k [B] draft length per row
    (positions >= k_b are padding), u_accept [B,K] and u_next [B] uniforms in [0, 1).
    """
    bsz, kmax = draft.shape
    rows = torch.arange(bsz)
    if kmax:
        idx = draft[:, :, None]
        ratio = acceptance_ratio(p[:, :kmax].gather(-1, idx)[..., 0], q.gather(-1, idx)[..., 0])
        ok = (u_accept.double() < ratio) & (torch.arange(kmax)[None, :] < k[:, None])
        n_acc = leading_run(ok)
    else:
        n_acc = torch.zeros(bsz, dtype=torch.long)
    rejected = n_acc < k
    at = p[rows, n_acc].double()  # p_{n+1}: the bonus distribution when all were accepted
    if rejected.any():
        r = rows[rejected]
        at[r] = residual(p[r, n_acc[r]], q[r, n_acc[r]])
    token = sample(at, u_next)
    return Verdict(n_acc, token, at)


def leading_run(ok: torch.Tensor) -> torch.Tensor:
    """[B] the number of leading True entries of each row of ok [B,K]."""
    return ok.long().cumprod(-1).sum(-1)


def verify_coupled(
    p: torch.Tensor, draft: torch.Tensor, k: torch.Tensor, weights: torch.Tensor
) -> Verdict:
    """One verification step for coupled rows: p [B,K+1,V], draft [B,K], k [B], weights
    [B,K+1,V] (ones for a greedy row: the choice is then the argmax)."""
    bsz, kmax = draft.shape
    rows = torch.arange(bsz)
    choice = coupled_choice(p, weights)  # [B,K+1]: the target's token at every position
    ok = (draft == choice[:, :kmax]) & (torch.arange(kmax)[None, :] < k[:, None])
    n_acc = leading_run(ok) if kmax else torch.zeros(bsz, dtype=torch.long)
    return Verdict(n_acc, choice[rows, n_acc], p[rows, n_acc].double())


def verify_rows(
    p: torch.Tensor,
    q: torch.Tensor,
    draft: torch.Tensor,
    k: torch.Tensor,
    coupled: list[bool],
    u_accept: torch.Tensor,
    u_next: torch.Tensor,
    weights: torch.Tensor | None,
) -> Verdict:
    """A batch whose rows may use either rule: coupled rows (weights [n_coupled,K+1,V], in row
    order) by ``verify_coupled``, the others by ``verify``."""
    if not any(coupled):
        return verify(p, q, draft, k, u_accept, u_next)
    c = torch.tensor(coupled)
    if all(coupled):
        return verify_coupled(p, draft, k, weights)
    a = verify_coupled(p[c], draft[c], k[c], weights)
    b = verify(p[~c], q[~c], draft[~c], k[~c], u_accept[~c], u_next[~c])
    n_acc = torch.empty(len(coupled), dtype=torch.long)
    token = torch.empty(len(coupled), dtype=torch.long)
    dist = torch.empty(len(coupled), p.shape[-1], dtype=torch.float64)
    n_acc[c], token[c], dist[c] = a.num_accepted, a.next_token, a.next_dist
    n_acc[~c], token[~c], dist[~c] = b.num_accepted, b.next_token, b.next_dist
    return Verdict(n_acc, token, dist)
