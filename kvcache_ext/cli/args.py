"""What the subcommands share: argument types (argparse turns their errors into one line before any
command runs), spec strings, the one-line-error parser, the DeepSeek-V4 row options."""
from __future__ import annotations

import argparse
import math
import os

import torch

from ..plan import LAYOUTS, CacheSpec
from ..plan.presets import GROUP_PRESETS, preset


class CliError(Exception):
    """Bad input to a command: printed on one line, exit status 2."""


def _int_at_least(low: int, what: str):
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    return check


positive_int = _int_at_least(1, "a positive integer")
nonneg_int = _int_at_least(0, "an integer >= 0")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None


def lengths(text: str) -> list[int]:
    values = int_list(text)
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 0, got {text!r}")
    return values


def layout_name(text: str) -> str:
    if text not in LAYOUTS:
        raise argparse.ArgumentTypeError(f"layout must be one of {', '.join(LAYOUTS)}, got {text!r}")
    return text


def model_name(text: str) -> str:
    if text.lower() in GROUP_PRESETS:
        return text.lower()
    try:
        return preset(text).name
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}, {', '.join(GROUP_PRESETS)}") from None


def group_model_name(text: str) -> str:
    if text.lower() not in GROUP_PRESETS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(GROUP_PRESETS)}, got {text!r}")
    return text.lower()


def device_name(text: str) -> str:
    """cpu or an available CUDA device (checked here, so the demo never starts on a bad one)."""
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"must be cpu or cuda[:N], got {text!r}") from None
    if dev.type == "cpu":
        return text
    if dev.type != "cuda":
        raise argparse.ArgumentTypeError(f"must be cpu or cuda[:N], got {text!r}")
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device is available (use --device cpu)")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text!r}: only {torch.cuda.device_count()} CUDA device(s) are available")
    return text


def out_file(text: str) -> str:
    """A file path whose folder exists and is writable (checked before anything is printed)."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} of {text!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {folder!r} of {text!r} is not writable")
    return text


def out_file_with(suffix: str):
    """out_file, and the name must end in `suffix` (the format is taken from it)."""
    def check(text: str) -> str:
        if not text.lower().endswith(suffix):
            raise argparse.ArgumentTypeError(f"{text!r} must end in {suffix}")
        return out_file(text)
    return check


MAX_DEMO_TOKENS = 1 << 20  # the demo keeps inputs, a CPU copy and the reference in memory


def demo_tokens(text: str) -> int:
    n = positive_int(text)
    if n > MAX_DEMO_TOKENS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DEMO_TOKENS}, got {n}")
    return n


def parse_spec(text: str, default_layers: int, flag: str = "--spec") -> CacheSpec:
    """name:row_bytes[:layers[:heads]], e.g. mla:656 or kv:256:32:8; row_bytes A+B is a split
    page (the first A bytes of every token, then the last B), e.g. indexer:128+4."""
    parts = text.split(":")
    if len(parts) < 2 or len(parts) > 4 or not parts[0]:
        raise CliError(f"{flag} must be NAME:ROW_BYTES[:LAYERS[:HEADS]], got {text!r}")
    split = None
    try:
        if "+" in parts[1]:
            split = tuple(int(p) for p in parts[1].split("+"))
            if len(split) != 2:
                raise ValueError
            parts[1] = str(sum(split))
        nums = [int(p) for p in parts[1:]]
    except ValueError:
        raise CliError(f"{flag} must be NAME:ROW_BYTES[:LAYERS[:HEADS]] with integers (ROW_BYTES "
                       f"may be A+B for a split page), got {text!r}")
    layers = nums[1] if len(nums) > 1 else default_layers
    heads = nums[2] if len(nums) > 2 else 1
    return CacheSpec(parts[0], nums[0], layers, heads, split=split)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"error: {message}\n")


def v4_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mla", choices=("fp8_ds_mla", "flashinfer_fp8", "v41_mxfp8"), default="fp8_ds_mla",
                   help="DeepSeek-V4 KV row layout (default: %(default)s)")
    p.add_argument("--indexer", choices=("mxfp4", "fp8"), default="mxfp4",
                   help="DeepSeek-V4 indexer row (default: %(default)s)")
