"""The `numpy-tf` command. Nothing imports this module.

    numpy-tf check [--json] [--only PATTERN] [--fixtures DIR]
        every layer against its torch fixtures and finite differences, one table
    numpy-tf params --config FILE_OR_NAME [--json]
        the exact parameter count of a config, per component, without building the model
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _format_error(value: float) -> str:
    return "-" if value != value else f"{value:.1e}"   # NaN (nothing compared) prints as -


def check(args) -> int:
    from .verify import check_all, fixtures_dir

    directory = args.fixtures or fixtures_dir()
    started = time.perf_counter()
    results = check_all(directory, args.only)
    elapsed = time.perf_counter() - started
    if not results:
        print(f"no case files matching {args.only!r} in {directory}", file=sys.stderr)
        return 1
    passed = all(result.passed for result in results)
    if args.json:
        print(json.dumps({"passed": passed, "seconds": elapsed, "fixtures": str(directory),
                          "cases": [result.to_dict() for result in results]}, indent=1))
        return 0 if passed else 1
    header = ("case", "dtype", "forward err", "backward err", "finite-diff err", "verdict")
    rows = [header]
    for result in results:
        report = result.gradcheck
        fd = "-" if report is None else \
            f"{report.max_norm_rel_error:.1e} ({report.mode})"
        verdict = "pass" if result.passed else "FAIL"
        if result.error:
            verdict = f"FAIL: {result.error}"
        elif not result.passed:
            failing = [c.key for c in result.comparisons if not c.passed]
            if report is not None and not report.passed:
                failing.append("finite differences")
            verdict = "FAIL: " + ", ".join(failing)
        rows.append((result.name, result.dtype,
                     _format_error(result.max_error(("output", "loss", "act"))),
                     _format_error(result.max_error(("grad", "grad_input", "grad_act"))),
                     fd, verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    print(f"numpy_tf check: {len(results)} torch cases from {directory}")
    print("errors: max |numpy_tf - torch| over outputs (forward) and gradients (backward); "
          "finite-diff: max ||a - n|| / ||n|| of numpy_tf's backward against its own forward")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    failures = sum(not result.passed for result in results)
    print(f"{len(results) - failures} passed, {failures} failed in {elapsed:.1f} s")
    return 0 if passed else 1


def params(args) -> int:
    from .accounting import account

    try:
        accounting = account(args.config)
    except (ValueError, TypeError, OSError) as error:
        print(f"numpy-tf params: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"config": args.config, **accounting.to_dict()}, indent=1))
    else:
        print(f"numpy-tf params --config {args.config}")
        print(accounting)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="numpy-tf", description="numpy_tf: a pure-NumPy "
                                     "Transformer reference with checked backward passes")
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser(
        "check", help="compare every layer with its torch fixtures and finite differences")
    check_parser.add_argument("--json", action="store_true", help="machine-readable output")
    check_parser.add_argument("--only", default="*",
                              help="glob on the case file names, e.g. 'gelu*' (default all)")
    check_parser.add_argument("--fixtures", type=Path, default=None,
                              help="a folder of case files (default: the packaged fixtures)")
    check_parser.set_defaults(run=check)
    params_parser = commands.add_parser(
        "params", help="count a config's parameters per component, without allocating them")
    params_parser.add_argument("--config", required=True, metavar="FILE_OR_NAME",
                               help="a config.json (HF gpt2/llama/bert, or numpy_tf GPTConfig "
                                    "as JSON), a folder holding one, or a preset: gpt2, "
                                    "llama-2-7b, bert-base-uncased, tiny-gpt")
    params_parser.add_argument("--json", action="store_true", help="machine-readable output")
    params_parser.set_defaults(run=params)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
