"""Write every fixture: `python reference/generate.py [--out DIR]` (default reference/fixtures).

Each family script draws its inputs and weights from fixed torch seeds, runs the torch modules
forward and backward, and writes one case file per (case, dtype). The scripts are deterministic:
regenerating gives the same arrays (`python reference/compare.py DIR reference/fixtures`), on
any x86-64 CPU: the script pins torch's kernels and MKL's products to their portable paths.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# The same arrays on every x86-64 CPU: torch's own kernels in their portable form (not the AVX2
# or AVX-512 variants it picks by CPU, whose reductions round differently), MKL's products in
# its reproducible mode, and oneDNN's JIT kernels (torch's float32 GELU runs oneDNN's) held to
# AVX2, the instruction set the committed fixtures were made with (on an AVX-512 CPU oneDNN's
# own erf rounds otherwise: 21 of the 36 outputs of gelu_none_float32 differ). All are read
# when torch loads, so they are set before the import.
os.environ["ATEN_CPU_CAPABILITY"] = "default"
os.environ["MKL_CBWR"] = "COMPATIBLE"
os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import attention  # noqa: E402
import bert  # noqa: E402
import cbow  # noqa: E402
import feedforward  # noqa: E402
import gemma  # noqa: E402
import gpt  # noqa: E402
import llama  # noqa: E402
import mixtral  # noqa: E402
import mistral  # noqa: E402
import layers  # noqa: E402
import neox  # noqa: E402
import norm  # noqa: E402
import optim  # noqa: E402
import positions  # noqa: E402
import qwen  # noqa: E402
import rope  # noqa: E402
import transformer  # noqa: E402

FAMILIES = [layers, norm, positions, rope, attention, feedforward, optim, gpt, cbow, llama,
            transformer, bert, neox, mixtral, mistral, gemma, qwen]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=HERE / "fixtures")
    parser.add_argument("--only", nargs="*", help="family script names to run (default all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    count = 0
    for family in FAMILIES:
        name = family.__name__
        if args.only and name not in args.only:
            continue
        paths = family.build(args.out)
        count += len(paths)
        print(f"{name}: {len(paths)} cases")
    print(f"wrote {count} cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
