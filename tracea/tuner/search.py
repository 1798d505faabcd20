"""The search: Bayesian optimization of a kernel's time over a discrete SearchSpace.

- Initial design: the variant's default schedule first (the tuner never has to beat nothing),
  then, given `hints` (the same problem measured on other machines), the configurations they
  rank best, then a Latin hypercube over the encoded knobs, each point snapped to the nearest
  untried configuration.
- Model: an exact GP (gpytorch) on log time, Matern 5/2 with a length scale per knob, refit
  after every batch; log time because tile effects multiply and the noise of a timing is
  relative.
- Failures (no compile, wrong numbers, out of resources) are data: a second GP regresses
  +1 / -1 labels (the least-squares GP classifier, Rasmussen & Williams 6.5) and its
  probability of feasibility multiplies expected improvement, as BaCO does with its forest;
  a failed configuration is never tried again and never ends the search.
- Noise: every evaluation is a median of repeats; at the end the best few are timed again
  and any within `tolerance` of the fastest ties, broken by enumeration order, so the same
  search picks the same winner.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .space import SearchSpace, config_key

CANDIDATE_LIMIT = 20000  # larger spaces score a fixed random subset of the untried each step
HINTED = 3  # configurations other machines rank best, tried right after the default


@dataclass
class Evaluation:
    config: dict
    seconds: float | None  # median time; None: infeasible
    error: str | None = None  # why it is infeasible
    samples: list[float] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.seconds is not None


@dataclass
class SearchResult:
    best: Evaluation | None
    evaluations: list[Evaluation]  # in the order they ran
    stopped: str  # why the search ended: "budget", "time", "target", "exhausted"
    finalists: list[Evaluation] = field(default_factory=list)  # as timed again together at the end

    def evaluations_to_reach(self, seconds: float) -> int | None:
        """How many evaluations it took to first try a configuration at most `seconds`."""
        for i, e in enumerate(self.evaluations, 1):
            if e.feasible and e.seconds <= seconds:
                return i
        return None


class _Model:
    """An exact GP on encoded points (gpytorch), refit from scratch on each update."""

    def __init__(self, x, y, noise_floor: float, steps: int = 80):
        import gpytorch
        import torch

        class GP(gpytorch.models.ExactGP):
            def __init__(self, x, y, likelihood):
                super().__init__(x, y, likelihood)
                self.mean = gpytorch.means.ConstantMean()
                self.kernel = gpytorch.kernels.ScaleKernel(
                    gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=x.shape[-1]))

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean(x), self.kernel(x))

        self.torch = torch
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(noise_floor))
        self.model = GP(x, y, self.likelihood)
        self.model.train()
        self.likelihood.train()
        optimizer = torch.optim.Adam(self.model.parameters(), lr=0.1)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(self.likelihood, self.model)
        with gpytorch.settings.cholesky_jitter(1e-4):
            for _ in range(steps):
                optimizer.zero_grad()
                loss = -mll(self.model(x), y)
                loss.backward()
                optimizer.step()
        self.model.eval()
        self.likelihood.eval()

    def predict(self, x, latent: bool = False):
        """Mean and standard deviation at `x`: of an observation, or (latent) of the function."""
        import gpytorch
        with self.torch.no_grad(), gpytorch.settings.fast_pred_var(), gpytorch.settings.cholesky_jitter(1e-4):
            out = self.model(x) if latent else self.likelihood(self.model(x))
            return out.mean, out.variance.clamp_min(1e-12).sqrt()


def _normal_cdf(z):
    import torch
    return 0.5 * (1 + torch.erf(z / math.sqrt(2)))


def expected_improvement(mean, std, best):
    """E[max(best - f, 0)] for f ~ N(mean, std^2) (minimization)."""
    import torch
    z = (best - mean) / std
    pdf = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return std * (z * _normal_cdf(z) + pdf)


def search(space: SearchSpace, evaluate: Callable[[list[dict]], list[Evaluation]], *, budget: int = 40,
           seconds: float | None = None, initial: int = 6, batch: int = 1, seed: int = 0,
           first: dict | None = None, tolerance: float = 0.02, confirm: Callable[[list[dict]], list[Evaluation]] | None = None,
           progress: Callable[[Evaluation, int, Evaluation | None], None] | None = None,
           strategy: str = "gp", prior: list[Evaluation] = (), stop_below: float | None = None,
           learn_failures: bool = True, hints: Sequence[Sequence[Evaluation]] = ()) -> SearchResult:
    """Search `space` for the fastest configuration. `evaluate(configs)` measures a batch (its
    compiles may run in parallel) and returns their Evaluations; `first` (the default schedule's
    configuration) is tried first when it is in the space. Stops after `budget` evaluations,
    `seconds`, or when every configuration is tried. strategy "random" is the baseline the
    replay compares against. `confirm(configs)` re-times the finalists (else their medians stand).
    `prior`: evaluations made before (the tuning cache's), known without counting in the budget.
    `stop_below`: stop as soon as a configuration runs in at most this many seconds.
    learn_failures=False drops the feasibility model (failed configurations are still never
    tried again): the ablation that shows what it is worth.
    `hints`: per other machine, its evaluations of the same problem; the HINTED configurations
    of this space they rank best are tried after `first` (in place of Latin hypercube points).
    Hints outside the space, failed or damaged are ignored; without hints nothing changes."""
    import torch

    configs = space.configurations()
    keys = [config_key(c) for c in configs]
    order = {k: i for i, k in enumerate(keys)}
    points = torch.tensor([space.encode(c) for c in configs], dtype=torch.float64)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    done: list[Evaluation] = [e for e in prior if config_key(e.config) in order]
    tried: set[str] = {config_key(e.config) for e in done}
    made = 0  # evaluations of this call
    started = time.perf_counter()
    queue: list[int] = []
    if first is not None and config_key(first) in order:
        queue.append(order[config_key(first)])
    if strategy == "random":
        rest = [i for i in range(len(configs)) if i not in queue]
        rng.shuffle(rest)
        queue += rest
    elif strategy == "gp":
        # hints replace Latin hypercube points (measured: better than adding to them, and 3 than 2)
        queue += [i for i in _ranked_hints(hints, order) if i not in queue][:HINTED]
        queue += _latin_hypercube(points, max(0, initial - len(queue)), set(queue), seed)
    else:
        raise ValueError(f"strategy must be 'gp' or 'random', got {strategy!r}")

    def best() -> Evaluation | None:
        feasible = [e for e in done if e.feasible]
        return min(feasible, key=lambda e: e.seconds) if feasible else None

    stopped = "exhausted"
    while len(tried) < len(configs):
        if made >= budget:
            stopped = "budget"
            break
        if seconds is not None and time.perf_counter() - started > seconds:
            stopped = "time"
            break
        if stop_below is not None and (b := best()) is not None and b.seconds <= stop_below:
            stopped = "target"
            break
        want = min(batch, budget - made, len(configs) - len(tried))
        picks: list[int] = []
        while queue and len(picks) < want:
            i = queue.pop(0)
            if keys[i] not in tried:
                tried.add(keys[i])
                picks.append(i)
        if len(picks) < want:
            for i in _propose(points, keys, order, tried, done, want - len(picks), rng, learn_failures, tolerance):
                tried.add(keys[i])
                picks.append(i)
        for evaluation in evaluate([configs[i] for i in picks]):
            done.append(evaluation)
            made += 1
            if progress is not None:
                progress(evaluation, made, best())
    preferred = config_key(first) if first is not None else None
    winner, finalists = _winner(done, order, tolerance, confirm, preferred)
    return SearchResult(winner, done[len(done) - made:], stopped, finalists)


def _ranked_hints(hints: Sequence[Sequence[Evaluation]], order: dict[str, int]) -> list[int]:
    """This space's configurations that other machines ran, best first: each machine's
    percentile rank (ranks, not times: machines differ in speed), averaged with weights by how
    much of this space the machine ran (one of the same ISA ran all of it and ranks alike; one
    of another ISA shares a few tiles, often ranked differently), ties to the better-covered."""
    ranks: dict[int, list[tuple[float, int]]] = {}
    for machine in hints:
        ran = {}
        for e in machine if isinstance(machine, (list, tuple)) else ():
            try:
                i, seconds = order.get(config_key(e.config)), float(e.seconds)
            except (AttributeError, TypeError, ValueError):
                continue  # a damaged hint: not a configuration with a time
            if i is not None and math.isfinite(seconds) and seconds > 0:
                ran[i] = min(seconds, ran.get(i, math.inf))
        ranked = sorted(ran, key=lambda i: (ran[i], i))
        for r, i in enumerate(ranked):
            ranks.setdefault(i, []).append((r / len(ranked), len(ranked)))
    score = {i: (sum(p * w for p, w in rs) / sum(w for _, w in rs), -sum(w for _, w in rs), i)
             for i, rs in ranks.items()}
    return sorted(score, key=score.get)


def _latin_hypercube(points, count: int, taken: set[int], seed: int) -> list[int]:
    """`count` configurations spread over the space: a Latin hypercube sample of the unit cube,
    each point snapped to the nearest configuration not yet chosen."""
    if count <= 0:
        return []
    import torch
    from scipy.stats import qmc
    sample = torch.tensor(qmc.LatinHypercube(d=points.shape[1], seed=seed).random(count), dtype=points.dtype)
    chosen: list[int] = []
    for p in sample:
        distance = ((points - p) ** 2).sum(dim=1)
        for i in [*taken, *chosen]:
            distance[i] = math.inf
        if math.isinf(float(distance.min())):
            break
        chosen.append(int(distance.argmin()))
    return chosen


def _propose(points, keys, order, tried, done, want, rng, learn_failures: bool = True,
             tolerance: float = 0.0) -> list[int]:
    """The untried configurations of highest expected improvement x probability of feasibility
    (a batch takes the next best: the compiles of a batch run in parallel). Improvement counts
    from `tolerance` below the best (timings closer than that are ties): without that margin the
    search spent its evaluations on knobs that do not matter, around the best so far (a conv's
    M block, 8 of 25 evaluations at 1.18-1.20x the best, while the register tile that does
    matter waited)."""
    import torch
    untried = [i for i in range(len(keys)) if keys[i] not in tried]
    if len(untried) > CANDIDATE_LIMIT:
        untried = sorted(rng.sample(untried, CANDIDATE_LIMIT))
    if not done:
        return sorted(rng.sample(untried, want))
    seen = torch.stack([points[order[config_key(e.config)]] for e in done])
    feasible = [e.feasible for e in done]
    candidates = points[untried]
    score = torch.ones(len(untried), dtype=points.dtype)
    if sum(feasible) >= 2:
        y = torch.tensor([math.log(e.seconds) for e in done if e.feasible], dtype=points.dtype)
        scale = y.std().clamp_min(1e-3)
        yz = (y - y.mean()) / scale
        model = _Model(seen[torch.tensor(feasible)], yz, noise_floor=1e-4)
        mean, std = model.predict(candidates)
        score = expected_improvement(mean, std, yz.min() - math.log1p(tolerance) / scale)
    elif sum(feasible) == 1:  # one time known: explore by distance from what was tried
        score = torch.cdist(candidates, seen).min(dim=1).values
    if learn_failures and not all(feasible):
        labels = torch.tensor([1.0 if f else -1.0 for f in feasible], dtype=points.dtype)
        classifier = _Model(seen, labels, noise_floor=1e-2, steps=50)
        mean, std = classifier.predict(candidates, latent=True)
        score = score * _normal_cdf(mean / std)
    if not any(feasible):  # nothing ran yet: as far as possible from the failures
        score = torch.cdist(candidates, seen).min(dim=1).values
    ranked = sorted(range(len(untried)), key=lambda j: (-float(score[j]), untried[j]))
    return [untried[j] for j in ranked[:want]]


def _winner(done: list[Evaluation], order: dict[str, int], tolerance: float, confirm,
            preferred: str | None = None) -> tuple[Evaluation | None, list[Evaluation]]:
    """The fastest, after the finalists (within 3 tolerances of the best, and `preferred`, the
    default) are timed again together; ties within `tolerance` go to `preferred`, then to the
    first in the space's order."""
    feasible = sorted((e for e in done if e.feasible), key=lambda e: e.seconds)
    if not feasible:
        return None, []
    finalists = [e for e in feasible if e.seconds <= feasible[0].seconds * (1 + 3 * tolerance)][:4]
    # the default is always timed again beside them: one slow first measurement must not rule it out
    finalists += [e for e in feasible if config_key(e.config) == preferred and e not in finalists]
    if confirm is not None and len(finalists) > 1:
        again = {config_key(e.config): e for e in confirm([e.config for e in finalists]) if e.feasible}
        finalists = [again.get(config_key(e.config), e) for e in finalists]
        finalists.sort(key=lambda e: e.seconds)
    fastest = finalists[0].seconds
    tied = [e for e in finalists if e.seconds <= fastest * (1 + tolerance)]
    return min(tied, key=lambda e: (config_key(e.config) != preferred, order[config_key(e.config)])), finalists
