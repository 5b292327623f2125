"""From recorded sessions to per-call advantages: the composite reward, reward-to-go and the group baseline.

For call p of a session (calls 0 … n−1):

    r_p = α · r_p^process + [p = n−1] · (β · r^speed + r^outcome)

- r_p^process is the sum of the process rewards attached to call p (e.g. −1 for a malformed tool call);
- r^outcome is the sum of the session's outcome rewards (``failure_reward`` for a failed session);
- r^speed = h(T / T_baseline) with h(x) = clip(1 − x, −1, 1): T is the session's completion time and T_baseline
  the median completion time of its group's successful sessions (outcome > 0), so finishing right faster than the
  group pays (parallel tool calls finish sooner) and h(1) = 0. Only successful sessions get it (``speed_on=
  "success"``): a fast wrong answer is paid nothing, and a group that fails throughout has no advantage to
  amplify from timing noise alone. ``speed_on="all"`` pays every finished session; fewer than two gets 0.
  ``speed_domains`` limits it to some domains (for example the agent tasks, where time is tool-call parallelism;
  on a one-call reasoning task it would only pay for skipping the worked steps).

The advantage of every token of call c is the reward-to-go minus a baseline,

    Â_c = Σ_{p ≥ c} γ^{p−c} r_p − B,

with B the mean return R = Σ_p γ^p r_p of the group's sessions (``baseline="group"``), the mean of the *other*
sessions' returns (``"rloo"``, leave-one-out: B_i = (Σ_j R_j − R_i) / (G − 1), RLOO; a group of one gets its own
return) or 0 (``"none"``). ``normalize="group"`` divides by the group's return standard deviation (GRPO-style: with
the group baseline, the std-normalised estimator); ``"domain"`` standardises advantages within each domain of the
batch, so mixed reasoning, QA and agent tasks get comparable scales.

DAPO's soft overlong penalty (``overlong_max`` = L_max > 0, ``overlong_cache`` = L_cache) is added to the reward of
every call, over its completion length |y|: 0 for |y| ≤ L_max − L_cache, ((L_max − L_cache) − |y|) / L_cache
within the last L_cache tokens, −1 beyond L_max. ``dynamic_sampling``: groups whose sessions' returns are all equal
(no advantage to learn from) are dropped before the step and replaced from the pool
(``forge.learner.dynamic_sampling``).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from forge.settings import Settings, SettingsError, setting
from forge.v1 import pool_pb2

FAILED = pool_pb2.SESSION_STATUS_FAILED


@dataclass(frozen=True, kw_only=True)
class RewardConfig(Settings):
    alpha: float = setting(1.0, help="Weight of process rewards.")
    beta: float = setting(0.0, help="Weight of the completion-time reward.")
    gamma: float = setting(1.0, min=0, max=1, help="Discount of the reward-to-go over a session's calls.")
    baseline: str = setting("group", choices=("group", "rloo", "none"),
                            help="Advantage baseline: the group's mean return, the mean of the group's other sessions "
                                 "(rloo: leave-one-out) or none.")
    normalize: str = setting("none", choices=("none", "group", "domain"),
                             help="Divide advantages by the standard deviation of their group or domain.")
    failure_reward: float = setting(0.0, help="Outcome reward of a failed (abandoned, errored) session.")
    speed_on: str = setting("success", choices=("success", "all"),
                            help="Sessions the completion-time reward applies to: successful ones only, or every "
                                 "finished one.")
    speed_domains: tuple[str, ...] = setting((), separator=",",
                                             help="Comma-separated domains the completion-time reward applies to "
                                                  "(empty: all).")
    overlong_max: int = setting(0, min=0, help="DAPO's soft overlong penalty: L_max, the completion length past "
                                               "which a call's reward gets -1 (0: no penalty).")
    overlong_cache: int = setting(4096, min=1, help="DAPO's soft overlong penalty: L_cache, the last tokens before "
                                                    "L_max over which the penalty grows linearly from 0 to -1.")
    dynamic_sampling: bool = setting(False, help="Drop groups whose sessions' returns are all equal and take "
                                                 "replacements from the pool before the step (DAPO's dynamic "
                                                 "sampling; counted in dropped_groups).")
    eps: float = 1e-6                # guards the normalisation's division

    def check(self) -> None:
        if self.overlong_max and self.overlong_cache > self.overlong_max:
            raise SettingsError(f"--overlong-cache ({self.overlong_cache}) must be at most --overlong-max "
                                f"({self.overlong_max})")


@dataclass
class SessionRewards:
    session_id: str
    domain: str
    rewards: list[float]             # r_p per call
    advantages: list[float]          # Â_c per call
    outcome: float
    speed: float
    completion_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    session_return: float = 0.0      # R = Σ_p γ^p r_p


def speed_reward(completion_s: float, baseline_s: float) -> float:
    if baseline_s <= 0 or not math.isfinite(completion_s):
        return 0.0
    return max(-1.0, min(1.0, 1.0 - completion_s / baseline_s))


def completion_time(session: pool_pb2.SessionRecord) -> float:
    if "completion_time_s" in session.metrics:
        return float(session.metrics["completion_time_s"])
    return max(0.0, session.ended_at - session.started_at)


def outcome_reward(session: pool_pb2.SessionRecord, config: RewardConfig) -> float:
    if session.status == FAILED:
        return config.failure_reward
    return float(sum(session.outcome_rewards.values()))


def overlong_penalty(length: int, max_length: int, cache: int) -> float:
    """DAPO's soft overlong punishment of a completion of ``length`` tokens (0 with ``max_length`` 0)."""
    if max_length <= 0 or length <= max_length - cache:
        return 0.0
    if length <= max_length:
        return ((max_length - cache) - length) / cache
    return -1.0


def discounted(rewards: list[float], gamma: float) -> list[float]:
    """Reward-to-go of every position: Σ_{p ≥ c} γ^{p−c} r_p."""
    out, running = [0.0] * len(rewards), 0.0
    for index in range(len(rewards) - 1, -1, -1):
        running = rewards[index] + gamma * running
        out[index] = running
    return out


def group_rewards(sessions: list[pool_pb2.SessionWithCalls], config: RewardConfig) -> list[SessionRewards]:
    """Rewards and advantages of the sessions of one group (one queue entry)."""
    times = [completion_time(s.session) for s in sessions]
    outcomes = [outcome_reward(s.session, config) for s in sessions]
    paid = [s.session.status != FAILED and (config.speed_on == "all" or outcome > 0)
            and (not config.speed_domains or s.session.domain in config.speed_domains)
            for s, outcome in zip(sessions, outcomes, strict=True)]
    paid_times = [t for t, ok in zip(times, paid, strict=True) if ok]
    baseline_time = statistics.median(paid_times) if len(paid_times) > 1 else 0.0
    out: list[SessionRewards] = []
    for item, seconds, outcome, ok in zip(sessions, times, outcomes, paid, strict=True):
        session = item.session
        calls = sorted(item.calls, key=lambda c: c.index)
        rewards = [config.alpha * float(sum(call.process_rewards))
                   + overlong_penalty(len(call.completion_ids), config.overlong_max, config.overlong_cache)
                   for call in calls]
        speed = speed_reward(seconds, baseline_time) if ok else 0.0
        if rewards:
            rewards[-1] += config.beta * speed + outcome
        out.append(SessionRewards(session.session_id, session.domain, rewards, discounted(rewards, config.gamma),
                                  outcome, speed, seconds, dict(session.metrics)))
    returns = [s.advantages[0] if s.advantages else 0.0 for s in out]
    scale = 1.0
    if config.normalize == "group" and len(returns) > 1:
        scale = 1.0 / (statistics.pstdev(returns) + config.eps)
    for s, baseline in zip(out, baselines(returns, config.baseline), strict=True):
        s.session_return = s.advantages[0] if s.advantages else 0.0
        s.advantages = [(a - baseline) * scale for a in s.advantages]
    return out


def baselines(returns: list[float], kind: str) -> list[float]:
    """Each session's baseline B_i: the group's mean return, the others' mean (rloo) or 0."""
    if kind == "none" or not returns:
        return [0.0] * len(returns)
    if kind == "rloo" and len(returns) > 1:
        total = math.fsum(returns)
        return [(total - r) / (len(returns) - 1) for r in returns]
    if kind == "rloo":
        return list(returns)
    return [statistics.fmean(returns)] * len(returns)


def constant_group(rewards: list[SessionRewards], tolerance: float = 1e-9) -> bool:
    """Whether a group's sessions all have the same return (within ``tolerance``, relative beyond 1): no
    advantage to learn from (DAPO's dynamic sampling drops such groups)."""
    values = [r.session_return for r in rewards]
    return not values or max(values) - min(values) <= tolerance * max(1.0, max(abs(v) for v in values))


def normalize_by_domain(batch: list[SessionRewards], eps: float = 1e-6) -> None:
    """Standardise call advantages within each domain of the batch (weighted by calls)."""
    by_domain: dict[str, list[SessionRewards]] = defaultdict(list)
    for s in batch:
        by_domain[s.domain].append(s)
    for group in by_domain.values():
        values = [a for s in group for a in s.advantages]
        if len(values) < 2:
            continue
        mean, std = statistics.fmean(values), statistics.pstdev(values)
        for s in group:
            s.advantages = [(a - mean) / (std + eps) for a in s.advantages]


def batch_rewards(entries: list[pool_pb2.QueueEntry], config: RewardConfig) -> list[SessionRewards]:
    out = [r for entry in entries for r in group_rewards(list(entry.sessions), config)]
    if config.normalize == "domain":
        normalize_by_domain(out, config.eps)
    return out
