"""Where an op's tensors may live: the device rules of csrc/ops/op_list.h (the one list of ops),
read from the compiled library. The C++ dispatcher checks them before any kernel runs; the
fakes (fake.py) check them for torch.compile and FakeTensor; wrappers that read a value on the
host before calling the op (gather_rows, ...) check them first, so a meta or misplaced tensor is
refused by name rather than failing inside torch."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _C


@dataclass(frozen=True)
class DeviceRule:
    """Tensors on the device of `anchor`; `host` ones on the CPU or there; `cpu` ones on the CPU.
    No anchor (copy_spans): only the `cpu` rule."""

    anchor: str
    host: tuple[str, ...]
    cpu: tuple[str, ...]


def _rules() -> dict[str, DeviceRule]:
    return {name: DeviceRule(anchor, tuple(host.split()), tuple(cpu.split()))
            for name, anchor, host, cpu in _C.op_table()}


RULES: dict[str, DeviceRule] = _rules()


def check(op: str, args: dict[str, object]) -> None:
    """ValueError naming the argument and both devices when a tensor in `args` (argument name ->
    value) breaks op's rule; the same rule and wording as the C++ check."""
    rule = RULES[op]
    anchor = args.get(rule.anchor)
    dev = anchor.device if isinstance(anchor, torch.Tensor) else None
    for name, t in args.items():
        if not isinstance(t, torch.Tensor) or name == rule.anchor:
            continue
        if name in rule.cpu:
            if t.device.type != "cpu":
                raise ValueError(f"{op}: {name} must be a CPU tensor, got one on {t.device}")
        elif dev is not None and name in rule.host:
            if not (t.device == dev or (t.device.type == "cpu" and dev.type != "meta")):
                raise ValueError(f"{op}: {name} must be on the CPU or on the device of "
                                 f"{rule.anchor} ({dev}), got {t.device}")
        elif dev is not None and t.device != dev:
            raise ValueError(f"{op}: {name} must be on the device of {rule.anchor} ({dev}), got "
                             f"{t.device}")
    # a meta tensor among real ones that no rule above relates (an op without an anchor)
    tensors = [(n, t) for n, t in args.items() if isinstance(t, torch.Tensor)]
    meta = next((n for n, t in tensors if t.device.type == "meta"), None)
    real = next(((n, t.device) for n, t in tensors if t.device.type != "meta"), None)
    if meta is not None and real is not None:
        raise ValueError(f"{op}: {meta} is a meta tensor (no data) but {real[0]} is on {real[1]}: "
                         "every tensor argument must be real, or every one fake")
