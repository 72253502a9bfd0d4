"""``vllm-probe tiny-model [DIR]``: write the tiny local model and print its path."""

from __future__ import annotations

import argparse

from ..sim.tiny_model import DEFAULT_DIR, write_tiny_model
from . import path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", default=str(DEFAULT_DIR), type=path_arg,
                   help=f"where to write it (default {DEFAULT_DIR})")
    p.add_argument("--overwrite", action="store_true", help="rewrite an existing folder")


def main(args: argparse.Namespace) -> int:
    print(write_tiny_model(args.dir, overwrite=args.overwrite))
    return 0
