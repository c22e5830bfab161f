#!/usr/bin/env python3
"""Writes the two synthetic noisy traces of examples/traces/synthetic/ (seeded, reproducible).

- diurnal_poisson.rate.csv: a diurnal rate between 20 and 300 events/s (a day-long cosine with a
  weekday/weekend factor), observed as the per-minute count of a Poisson process: each row is
  count / 60, the rate a per-minute log would give (standard error sqrt(rate / 60)).
- sine_noise10.rate.csv: a sine between 40 and 200 records/s with a 6-hour period, each minute
  multiplied by a uniform factor in [0.9, 1.1] (+-10 % per-minute noise).

Both are 14 days at 1-minute resolution. Usage: make-noisy-traces.py [OUT_DIR] [SEED]
"""
import math
import os
import random
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "examples/traces/synthetic"
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 20261202
rng = random.Random(seed)
os.makedirs(out, exist_ok=True)
DAYS, STEP = 14, 60


def poisson(lam):
    # Knuth's method is too slow at lam ~ 18 000; a normal approximation with continuity is
    # exact enough at these means (lam >= 1200), and the discreteness is kept by rounding.
    return max(0, round(rng.gauss(lam, math.sqrt(lam))))


with open(os.path.join(out, "diurnal_poisson.rate.csv"), "w") as f:
    f.write("t_seconds,rate\n")
    for k in range(DAYS * 86400 // STEP):
        t = k * STEP
        day = t / 86400.0
        weekend = 0.75 if int(day) % 7 in (5, 6) else 1.0
        # Trough at 04:00, peak at 16:00.
        shape = 0.5 - 0.5 * math.cos(2 * math.pi * (day - 4 / 24))
        rate = 20.0 + 280.0 * shape * weekend
        f.write(f"{t},{poisson(rate * STEP) / STEP:.6g}\n")

with open(os.path.join(out, "sine_noise10.rate.csv"), "w") as f:
    f.write("t_seconds,rate\n")
    for k in range(DAYS * 86400 // STEP):
        t = k * STEP
        rate = 120.0 + 80.0 * math.sin(2 * math.pi * t / (6 * 3600))
        f.write(f"{t},{rate * rng.uniform(0.9, 1.1):.6g}\n")
