"""The connector's scheduler half on its own (no engine): what it keeps per request is dropped
when the request ends, whether or not vLLM got as far as allocating its blocks."""
from __future__ import annotations

from types import SimpleNamespace as NS

from vllm.v1.request import RequestStatus

from kvcache_ext.vllm.config import ConnectorConfig
from kvcache_ext.vllm.scheduler import SchedulerSide


def decode_request(rid: str, prompt_len: int = 40) -> NS:
    return NS(request_id=rid, prompt_token_ids=list(range(prompt_len)),
              kv_transfer_params={"do_remote_prefill": True}, status=RequestStatus.WAITING)


def test_a_request_aborted_before_its_allocation_leaves_nothing_behind():
    s = SchedulerSide(NS(kv_transfer_config=NS(engine_id="d")), ConnectorConfig())
    kept, aborted = decode_request("kept"), decode_request("aborted")
    assert s.get_num_new_matched_tokens(kept, 16) == (24, True)
    assert s.get_num_new_matched_tokens(aborted, 8) == (32, True)
    aborted.status = RequestStatus.FINISHED_ABORTED  # vLLM frees it while it still waits
    assert s.request_finished(aborted, ([],)) == (False, None)
    assert set(s._local_hit) == {"kept"}  # the aborted request's local hit is gone
    s.request_finished(kept, ([],))
    assert s._local_hit == {}
