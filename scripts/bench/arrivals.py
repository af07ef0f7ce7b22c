#!/usr/bin/env python3
"""Arrival gaps as `vllm bench serve --request-rate R --burstiness B` draws them, with the
statistics sous's unit test prints for its own (`cargo test -p sous --lib arrivals --
--nocapture`), so that the two can be set side by side.

vLLM (vllm-project/vllm vllm/benchmarks/serve.py get_request) draws each gap from
numpy's gamma of shape B and scale 1 / (R * B), sums them, and scales the sums so that
the last arrival is at N / R. This script does the same with numpy when it is installed,
else with Python's random.gammavariate (the same distribution, another generator); the
numbers differ from sous's (another generator again), the statistics should not:

- the mean gap (1 / R);
- the coefficient of variation of the gaps (1 / sqrt(B));
- the Kolmogorov-Smirnov statistic of the raw gaps, and of the scaled schedule's gaps,
  against the gamma CDF (closed forms for B = 0.5, 1 and 2); a correct sampler stays
  under 1.95 / sqrt(N) with probability 0.999.

    scripts/bench/arrivals.py [--n 20000] [--rate 20] [--seed 0]
"""

import argparse
import math
import random


def gamma_cdf(shape, scale, x):
    """The gamma CDF for the shapes with a closed form here."""
    if x <= 0:
        return 0.0
    y = x / scale
    if shape == 0.5:
        return math.erf(math.sqrt(y))
    if shape == 1.0:
        return 1.0 - math.exp(-y)
    if shape == 2.0:
        return 1.0 - math.exp(-y) * (1.0 + y)
    raise ValueError(f"no closed-form CDF for shape {shape}")


def ks(values, cdf):
    v = sorted(values)
    n = len(v)
    return max(max(abs(cdf(x) - i / n), abs((i + 1) / n - cdf(x))) for i, x in enumerate(v))


def mean_and_cv(values):
    n = len(values)
    mean = sum(values) / n
    var = sum((x - mean) ** 2 for x in values) / n
    return mean, math.sqrt(var) / mean


def draw(n, rate, shape, seed):
    """N gaps and the generator's name."""
    scale = 1.0 / (rate * shape)
    try:
        import numpy as np

        np.random.seed(seed)
        return [float(g) for g in np.random.gamma(shape=shape, scale=scale, size=n)], "numpy"
    except ImportError:
        rng = random.Random(seed)
        return [rng.gammavariate(shape, scale) for _ in range(n)], "random.gammavariate"


def schedule_gaps(gaps, rate):
    """vLLM's schedule: running sums scaled so the last is N / rate; returned as gaps."""
    times, total = [], 0.0
    for g in gaps:
        total += g
        times.append(total)
    factor = len(gaps) / rate / times[-1]
    times = [t * factor for t in times]
    return [t - p for t, p in zip(times, [0.0] + times[:-1])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    bound = 1.95 / math.sqrt(args.n)
    print(f"N = {args.n}, rate = {args.rate}/s, seed = {args.seed}, KS bound {bound:.4f}")
    print("shape  generator            mean gap ms  CV (want)         KS raw  KS scheduled")
    for shape in (0.5, 1.0, 2.0):
        gaps, generator = draw(args.n, args.rate, shape, args.seed)
        mean, cv = mean_and_cv(gaps)
        scale = 1.0 / (args.rate * shape)
        d_raw = ks(gaps, lambda x: gamma_cdf(shape, scale, x))
        d_sched = ks(schedule_gaps(gaps, args.rate), lambda x: gamma_cdf(shape, scale, x))
        want = 1.0 / math.sqrt(shape)
        print(
            f"{shape:<5}  {generator:<19}  {mean * 1000:<11.3f}  {cv:.4f} ({want:.4f})"
            f"   {d_raw:.4f}  {d_sched:.4f}"
        )


if __name__ == "__main__":
    main()
