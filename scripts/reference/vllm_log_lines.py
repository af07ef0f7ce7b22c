#!/usr/bin/env python3
"""Writes the DGX Spark before/after logs of tests/fixtures/vllm-logs/: the lines vLLM
0.27.1 prints while it serves, derived from its own format strings (no vLLM could run
here: it needs the GPU it was built for).

The strings, quoted with their files in vLLM 0.27.1's sdist:

- vllm/logger.py: _FORMAT "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
  with _DATE_FORMAT "%m-%d %H:%M:%S", after the "(APIServer pid=N) " prefix of the
  process;
- vllm/v1/metrics/loggers.py, LoggingStatLogger.log (the call at line 310): the parts
  "Avg prompt throughput: %.1f tokens/s", "Avg generation throughput: %.1f tokens/s",
  "Running: %d reqs", "Waiting: %d reqs", ["Preemptions: %d" when non-zero],
  "GPU KV cache usage: %.1f%%", "Prefix cache hit rate: %.1f%%", joined by ", " after
  "Engine 000: "; the hit rate is over the most recent 1000 requests (PrefixCachingMetrics);
- vllm/v1/spec_decode/metrics.py, SpecDecodingLogging.log (the call at line 120):
  "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s,
  Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens,
  Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%", with the
  per-position rates as ", ".join(f"{p:.3f}") and a mean acceptance length of
  1 + accepted / drafts.

The traffic is simulated from integer counts per 10-second interval, so that every line
is what vLLM's arithmetic gives for its counts, with figures inside the ranges the DGX
Spark report quotes: the baseline (no prefix caching that worked, no MTP) about 9 tok/s
for one request and a 0.0 % hit rate; the tuned recipe (MTP with 2 speculative tokens,
prefix caching, --max-num-seqs 4) 22-31 tok/s for one request, 40-56 tok/s at 4, an
acceptance of 60-82 % per line and a mean acceptance length of 2.3-2.6, and a hit rate
that climbs from 0 % to 84-86 %. Usage: python3 vllm_log_lines.py OUT_DIR
"""

import random
import sys
from collections import deque
from datetime import datetime, timedelta
from pathlib import Path

PID = 1
STATS_SRC = "loggers.py:310"
SPEC_SRC = "metrics.py:120"


def prefix(at, src, level="INFO"):
    return f"(APIServer pid={PID}) {level} {at.strftime('%m-%d %H:%M:%S')} [{src}] "


def stats_line(prompt_tps, gen_tps, running, waiting, preemptions, kv, hit):
    parts = [
        "Avg prompt throughput: %.1f tokens/s" % prompt_tps,
        "Avg generation throughput: %.1f tokens/s" % gen_tps,
        "Running: %d reqs" % running,
        "Waiting: %d reqs" % waiting,
    ]
    if preemptions > 0:
        parts.append("Preemptions: %d" % preemptions)
    parts.append("GPU KV cache usage: %.1f%%" % (kv * 100))
    parts.append("Prefix cache hit rate: %.1f%%" % (hit * 100))
    return "Engine 000: " + ", ".join(parts)


def spec_line(drafts, per_pos, elapsed):
    k = len(per_pos)
    drafted = drafts * k
    accepted = sum(per_pos)
    rates = ", ".join(f"{a / drafts:.3f}" for a in per_pos)
    return (
        "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
        "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
        "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%"
        % (
            1 + accepted / drafts,
            accepted / elapsed,
            drafted / elapsed,
            accepted,
            drafted,
            rates,
            accepted / drafted * 100,
        )
    )


class PrefixCache:
    """PrefixCachingMetrics: the hit rate over the most recent 1000 requests."""

    def __init__(self):
        self.queue = deque()

    def observe(self, queries, hits):
        self.queue.append((queries, hits))
        while len(self.queue) > 1000:
            self.queue.popleft()

    def rate(self):
        q = sum(x[0] for x in self.queue)
        return sum(x[1] for x in self.queue) / q if q else 0.0


def simulate(out, start, tuned, seed):
    rng = random.Random(seed)
    # Generation tok/s per running request count: the ranges of the report.
    speed = (
        {1: (22.4, 30.6), 2: (30, 41), 3: (36, 49), 4: (40.4, 55.6)}
        if tuned
        else {1: (8.2, 9.8), 2: (13.5, 16.5), 3: (17, 20.5), 4: (19.5, 23.5)}
    )
    cache = PrefixCache()
    lines = [
        prefix(start, "utils.py:253")
        + "non-default args: {'model_tag': '/models/qwen3.8-27b-nvfp4', 'host': '0.0.0.0', "
        + "'max_model_len': 65536, 'gpu_memory_utilization': %s, 'max_num_seqs': %d%s}"
        % (
            "0.85" if tuned else "0.45",
            4 if tuned else 256,
            ", 'enable_prefix_caching': True, 'speculative_config': {'method': "
            "'qwen3_next_mtp', 'num_speculative_tokens': 2}"
            if tuned
            else "",
        ),
        prefix(start + timedelta(seconds=95), "api_server.py:2042")
        + "Starting vLLM API server 0 on http://0.0.0.0:8000",
    ]
    t = start + timedelta(seconds=100)
    conversations = 0
    for _burst in range(14):
        # A burst of chat: 6 to 24 intervals with 1 to 4 requests running.
        running = rng.randint(1, 4)
        for _ in range(rng.randint(6, 24)):
            elapsed = 10.0 + rng.uniform(0.0, 0.05)
            t += timedelta(seconds=10)
            # New requests in the interval: their prompt tokens, computed or cached.
            new = rng.randint(0, running)
            computed = 0
            for _ in range(new):
                conversations += 1
                queries = rng.randint(2500, 9000)
                # A new conversation's first turn shares only the system prompt.
                shared = 0.0
                if tuned and conversations > 3:
                    shared = rng.uniform(0.84, 0.9)
                hits = int(queries * shared) // 16 * 16
                cache.observe(queries, hits)
                computed += queries - hits
                # uvicorn's access line carries no time of its own.
                lines.append(
                    f"(APIServer pid={PID}) INFO:     10.42.1.7:{rng.randint(40000, 60000)} - "
                    '"POST /v1/chat/completions HTTP/1.1" 200 OK'
                )
            lo, hi = speed[running]
            target = rng.uniform(lo, hi) * elapsed
            waiting = rng.choice([0, 0, 0, 1, 2]) if running == 4 else 0
            kv = min(0.97, running * rng.uniform(0.05, 0.09))
            spec = None
            if tuned:
                p0 = rng.uniform(0.8, 0.9)
                p1 = p0 * rng.uniform(0.58, 0.74)
                # Every step emits 1 + accepted tokens.
                drafts = max(1, round(target / (1 + p0 + p1)))
                per_pos = [round(p0 * drafts), round(p1 * drafts)]
                generated = drafts + sum(per_pos)
                spec = (drafts, per_pos)
            else:
                generated = round(target)
            lines.append(
                prefix(t, STATS_SRC)
                + stats_line(computed / elapsed, generated / elapsed, running, waiting, 0, kv, cache.rate())
            )
            if spec:
                lines.append(prefix(t, SPEC_SRC) + spec_line(spec[0], spec[1], elapsed))
            if rng.random() < 0.2:
                running = max(1, min(4, running + rng.choice([-1, 1])))
        # Idle between bursts: vLLM logs nothing at INFO.
        t += timedelta(seconds=rng.randint(60, 900))
    out.write_text("\n".join(lines) + "\n")


def main():
    out = Path(sys.argv[1])
    simulate(out / "dgx-spark-baseline.log", datetime(2026, 11, 14, 18, 2, 11), False, 1)
    simulate(out / "dgx-spark-tuned.log", datetime(2026, 11, 15, 11, 40, 37), True, 2)


if __name__ == "__main__":
    main()
