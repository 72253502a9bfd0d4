"""``vllm-probe compare``: not built yet."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?")


def main(args: argparse.Namespace) -> int:
    raise SystemExit("vllm-probe compare: not implemented yet")
