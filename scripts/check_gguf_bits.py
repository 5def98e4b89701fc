"""Save, or compare with saved, int8-x GGUF outputs on random data: bitwise equality of a kernel
change. Usage: python scripts/check_gguf_bits.py save|check FILE"""

import sys

import gguf
import numpy as np
import torch

from specdec import ops
from specdec.kernels import gguf as gk

Q = gguf.GGMLQuantizationType
# the types checked (in this order: it fixes the random blocks); each block's fp16 steps
# (gk.SCALE_BYTES) finite, every other byte random
TYPES = (Q.Q4_K, Q.Q6_K, Q.Q5_K, Q.Q2_K, Q.Q3_K, Q.Q4_0, Q.Q8_0, Q.IQ4_NL, Q.IQ4_XS)


def outputs():
    g = torch.Generator().manual_seed(1)
    rows, k, out = 203, 1280, {}
    for qtype in TYPES:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = torch.randint(0, 256, (rows, k // block, size), dtype=torch.uint8, generator=g)
        for at in gk.SCALE_BYTES[qtype]:  # finite steps in [0.001, 0.1)
            d = (torch.rand(rows, k // block, generator=g) * 0.099 + 0.001).half()
            raw[:, :, at : at + 2] = d.view(torch.uint8).reshape(rows, k // block, 2)
        pw = gk.pack(qtype, raw.reshape(rows, -1), rows, k)
        for m in (1, 2, 5, 16, 17):
            x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4
            for nt in (1, 2):
                ops.set_num_threads(nt)
                out[f"{qtype.name}_m{m}_t{nt}"] = gk.linear(x, pw).numpy().copy()
    return out


def main():
    mode, path = sys.argv[1], sys.argv[2]
    got = outputs()
    if mode == "save":
        np.savez(path, **got)
        print(f"saved {len(got)} outputs")
        return
    ref = np.load(path)
    bad = [n for n in got if not np.array_equal(got[n].view(np.uint32), ref[n].view(np.uint32))]
    print(
        f"{len(got) - len(bad)}/{len(got)} bitwise equal",
        "MISMATCH: " + ", ".join(bad) if bad else "",
    )
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
