"""The synthetic associative-recall task the shipped checkpoints are trained on (tools/train).

A sequence is n key-value pairs, then one query key; the target is the value that followed that key:

    k_1 v_1 k_2 v_2 ... k_n v_n q        ->  v_j  where k_j == q

Keys are distinct, drawn from KEYS (token ids 0..15); values are drawn from VALUES (16..31); the
vocabulary has 32 tokens. L = 2n + 1. The matching key sits at position 2j, its value at 2j + 1.
"""
from __future__ import annotations

import numpy as np

N_KEYS, N_VALUES = 16, 16
VOCAB = N_KEYS + N_VALUES
PAIRS = 8
LENGTH = 2 * PAIRS + 1


def batch(rng: np.random.Generator, size: int, pairs: int = PAIRS):
    """(ids (size, 2 pairs + 1) int64, targets (size,) int64, key positions (size,) int64)."""
    ids = np.empty((size, 2 * pairs + 1), np.int64)
    targets = np.empty(size, np.int64)
    where = np.empty(size, np.int64)
    for b in range(size):
        keys = rng.choice(N_KEYS, size=pairs, replace=False)
        values = N_KEYS + rng.integers(0, N_VALUES, size=pairs)
        ids[b, 0:2 * pairs:2] = keys
        ids[b, 1:2 * pairs:2] = values
        j = rng.integers(0, pairs)
        ids[b, -1] = keys[j]
        targets[b] = values[j]
        where[b] = 2 * j
    return ids, targets, where
