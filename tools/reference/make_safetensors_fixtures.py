#!/usr/bin/env python3
"""Writes tests/data/safetensors/: .safetensors files written by Hugging Face's own `safetensors`
package (the reference writer), with each tensor's values beside them as float64 .npy files, for
tests/checkpoint/safetensors_test.cpp.

    python3 -m venv /tmp/st && /tmp/st/bin/pip install numpy==2.1.3 safetensors==0.4.5 ml_dtypes==0.5.0
    /tmp/st/bin/python tools/reference/make_safetensors_fixtures.py

mixed.safetensors holds every dtype the reader converts (F32, F64, F16, BF16: values drawn so that
they are exact in the stored dtype, plus inf, -0 and a subnormal half), a scalar, an empty tensor,
an I64 tensor (listed, refused when read) and metadata. Expected values: <name with dots as _>.npy.
"""
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "safetensors")


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261125)
    half = rng.standard_normal(7).astype(np.float16)
    half[0], half[1], half[2] = np.float16(np.inf), np.float16(-0.0), np.float16(2.0 ** -24)  # smallest subnormal
    tensors = {
        "backbone.layers.0.mixer.A_log": rng.standard_normal((3, 4)).astype(np.float32),
        "backbone.layers.0.mixer.conv1d.weight": rng.standard_normal((6, 1, 4)).astype(np.float32),
        "w64": rng.standard_normal((2, 3, 2)),
        "half": half,
        "bf": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
        "scalar": np.array(1.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "ints": np.array([1, -2], dtype=np.int64),
    }
    save_file(tensors, os.path.join(OUT, "mixed.safetensors"), metadata={"format": "pt", "source": "iattn fixture"})
    for name, a in tensors.items():
        if a.dtype == np.int64:
            continue
        np.save(os.path.join(OUT, name.replace(".", "_") + ".npy"), a.astype(np.float64))


if __name__ == "__main__":
    main()
