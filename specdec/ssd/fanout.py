"""Fan-out: how the speculation budget B is split over the verification outcomes.

After round t the target emits k accepted drafts (k = 0..K) and one more token b. Outcome k
has probability P(k) = alpha^k (1 - alpha) for k < K and alpha^K for k = K. With a miss rate
that falls like F^-r in the number F of candidates prepared for an outcome, the expected miss
mass sum_k P(k) F_k^-r under sum_k F_k = B is smallest for F_k ~ P(k)^(1/(1+r)): a geometric
series alpha^(k/(1+r)) for k < K with its own jump for k = K (the paper's geometric fan-out).
"""

from __future__ import annotations

from specdec.config import FANOUTS


def outcome_probabilities(alpha: float, k: int) -> list[float]:
    alpha = min(max(alpha, 1e-6), 1 - 1e-6)
    probs = [alpha**i * (1 - alpha) for i in range(k)]
    return probs + [alpha**k]


def plan_fanout(
    budget: int, k: int, alpha: float, kind: str = "geometric", r: float = 1.0, cap: int = 64
) -> list[int]:
    """F_0..F_k: candidates prepared after each number of accepted tokens (sum <= budget).

    "pipeline" prepares only the all-accepted outcome with its top-1 bonus token (the
    speculation pipelining of plain async drafting, the ablation baseline)."""
    if kind not in FANOUTS:
        raise ValueError(f"fanout must be one of {', '.join(FANOUTS)}, got {kind!r}")
    if budget < 1:
        raise ValueError(f"speculation_budget must be >= 1, got {budget}")
    if kind == "pipeline":
        return [0] * k + [1]
    if kind == "uniform":
        weights = [1.0] * (k + 1)
    else:
        weights = [p ** (1.0 / (1.0 + r)) for p in outcome_probabilities(alpha, k)]
    total = sum(weights)
    raw = [budget * w / total for w in weights]
    fan = [min(cap, int(x)) for x in raw]
    # largest remainders get the leftover slots; the k = K outcome first on ties
    order = sorted(range(k + 1), key=lambda i: (raw[i] - int(raw[i]), i), reverse=True)
    for i in order:
        if sum(fan) >= budget:
            break
        if fan[i] < cap:
            fan[i] += 1
    if fan[k] == 0:  # the all-accepted outcome is the likeliest: always cover it
        donor = max(range(k), key=lambda i: fan[i], default=None)
        if donor is not None and fan[donor] > 0:
            fan[donor] -= 1
        fan[k] = 1
    return fan
