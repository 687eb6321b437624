"""Where an op's tensors may live (csrc/ops/op_list.h, the one list of ops): every op, driven with
each tensor argument moved to the meta device in turn, refuses the call with a ValueError naming
the argument and the devices, and leaves every tensor it was handed as it was -- a real cache
never reaches the Meta kernel, which checks and writes nothing. Fakes still run when every
tensor is fake."""
from __future__ import annotations

import pytest
import torch

from kvcache_ext.ops import devices
from test_opcheck import cases

CASES = cases("cpu")


def raw(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes (NaN-safe equality)."""
    return t.detach().contiguous().view(torch.uint8)


def tensor_args(op, args):
    names = [a.name for a in op.default._schema.arguments]
    return [(i, names[i]) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]


def test_every_op_of_the_list_has_a_case():
    ops = {op.default._schema.name.split("::")[1] for op, _ in CASES.values()}
    assert ops == set(devices.RULES), set(devices.RULES) ^ ops


@pytest.mark.parametrize("name", list(CASES))
def test_a_meta_argument_is_refused_and_nothing_changes(name):
    op, args = CASES[name]
    for i, arg in tensor_args(op, args):
        moved = list(args)
        moved[i] = torch.empty_like(args[i], device="meta")
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(ValueError, match=rf"{arg} .*meta|meta.* {arg}"):
            op(*moved)
        for a, b in zip(args, before):
            if isinstance(a, torch.Tensor):
                assert torch.equal(raw(a), raw(b)), (name, arg)


def test_the_message_names_both_devices():
    op, args = CASES["reshape_and_cache_fp8"]
    moved = list(args)
    moved[4] = torch.ones(1, device="meta")  # the scale: a host value, but not a meta one
    with pytest.raises(ValueError, match=r"reshape_and_cache: scale must be on the CPU or on the device "
                                         r"of view \(cpu\), got meta"):
        op(*moved)


def test_host_values_may_be_on_the_cpu_others_must_be_on_the_views_device():
    for op, rule in devices.RULES.items():
        assert set(rule.host) <= {"scale", "k_scale", "v_scale", "slot_mapping"}, op
    assert devices.RULES["copy_spans"].anchor == "" and devices.RULES["copy_spans"].cpu == ("spans",)


def test_fakes_run_when_every_tensor_is_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode
    for name, (op, args) in CASES.items():
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            op(*fake)  # checks devices, writes nothing


def test_all_meta_calls_reach_the_fake():
    op, args = CASES["concat_and_cache_mla"]
    op(*[torch.empty_like(a, device="meta") if isinstance(a, torch.Tensor) else a for a in args])


def test_a_wrapper_that_reads_a_value_first_refuses_a_meta_argument_by_name():
    """gather_kv reads cu_seq_lens on the host to size its output: a meta one raised torch's
    NotImplementedError ("Cannot copy out of meta tensor") there; now the op's rule refuses it."""
    import kvcache_ext as kvc
    plan = kvc.plan_cache([kvc.CacheSpec("k", 64, 1, 2)], 4, 16)
    cache = kvc.allocate(plan, fill=0)
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"gather_kv: cu_seq_lens must be on the device of view \(cpu\), "
                                         r"got meta"):
        kvc.ops.gather_kv(cache.view("k", 0), bt, torch.tensor([0, 20], dtype=torch.int32,
                                                                device="meta"))
