"""vLLM engines on a random Llama, each in a process of its own (and its own process group), driven
by commands over a pipe, every command bounded in time: the harness of the connector's tests
(tests/vllm_scenarios.py) and of benchmarks/bench_vllm_pd.py -- a test harness, outside the
package (nothing a user imports starts engines). Needs vllm (in the engine processes) and
transformers (make_model).

    with Engines(model_dir) as e:
        a = e.start("a", block_size=32, core=0)
        out = a.generate([Prompt(ids, max_tokens=8, params={"do_remote_decode": True})])
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvc_harness import tier

CONNECTOR = "KvcacheExtConnector"
V4_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "v4_site")


_HANDED_OUT: set[int] = set()  # harness-only: two calls in one driver never get the same port


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768 on) that this driver has not handed out
    before. A port the OS hands out for port 0 -- as an engine starting beside this one does for
    its own sockets -- can be taken between this check and the server's bind (the server then
    dies with "Address already in use"); every launcher of these harnesses takes its ports here."""
    rng = random.Random()
    while True:
        port = rng.randrange(20000, 32000)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def make_model(folder: str, layers: int = 2, kv_heads: int = 2, head_dim: int = 32,
               vocab: int = 128, seed: int = 0) -> str:
    """A random fp32 Llama saved to `folder` (SPEC 11: vLLM runs it offline)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    heads = kv_heads
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=heads * head_dim, intermediate_size=4 * head_dim,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=16384, torch_dtype="float32")
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(folder)
    return folder


def make_mla_model(folder: str, layers: int = 2, vocab: int = 128, seed: int = 0) -> str:
    """A random bf16 DeepSeek-V3-architecture model (MLA: kv_lora_rank 512 + rope 64 = the
    576-value latent row vLLM caches) saved to `folder`. DeepSeek-V3's own yarn rope_scaling:
    with the default RoPE vLLM-CPU's rope op rotates the 3-D tensors the MLA code hands it
    wrongly (tokens differ between runs whose cache bytes are equal). Dense layers only."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    torch.manual_seed(seed)
    cfg = DeepseekV3Config(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=layers, max_position_embeddings=4096, torch_dtype="bfloat16",
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})
    DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
    return folder


@dataclass
class Prompt:
    ids: list[int]
    max_tokens: int = 8
    params: dict | None = None   # kv_transfer_params
    salt: str | None = None      # a cache salt: no prefix-cache hit on other prompts


@dataclass
class Output:
    tokens: list[int]
    finish_reason: str | None
    params: dict | None
    seconds: float = 0.0         # from submitting the request to its end
    first_token_s: float = 0.0   # from submitting it to its first token (TTFT)
    top2_gaps: list[float] = field(default_factory=list)  # per token: top-1 minus top-2 logprob
    logprobs: list[float] = field(default_factory=list)   # per token: the chosen token's logprob


def _engine_main(conn, model: str, name: str, block_size: int, core: int, role: str | None,
                 connector: str, extra: dict, policy: str, max_len: int, num_blocks: int | None,
                 env: dict, dtype: str = "float32", load_format: str = "auto",
                 log_path: str | None = None) -> None:
    os.setpgrp()  # the engine's own processes in its group: a kill reaches them all
    if log_path:  # its output and its EngineCore's (which inherits the descriptors) in a file
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(core),
                       "UCX_NET_DEVICES": "lo", **env})
    try:
        from vllm import LLM, SamplingParams
        from vllm.config import KVTransferConfig
        from vllm.inputs import TokensPrompt
        kw = {}
        if role is not None:
            kw["kv_transfer_config"] = KVTransferConfig(
                kv_connector=connector, kv_role=role, engine_id=name,
                kv_connector_module_path="kvcache_ext.vllm" if connector == CONNECTOR else None,
                kv_load_failure_policy=policy, kv_connector_extra_config=extra,
                **({"kv_buffer_device": "cpu"} if connector == "NixlConnector" else {}))
        t0 = time.time()
        llm = LLM(model=model, skip_tokenizer_init=True, enforce_eager=True, dtype=dtype,
                  block_size=block_size, max_model_len=max_len, enable_prefix_caching=True,
                  disable_log_stats=False, seed=0, num_gpu_blocks_override=num_blocks,
                  load_format=load_format, **kw)
        conn.send(("ready", {"start_s": time.time() - t0, "prefix_caching": bool(
            llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)}))
    except Exception as e:  # noqa: BLE001 - reported to the driver
        import traceback
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    served = 0

    def submit(p: Prompt) -> str:
        nonlocal served
        served += 1
        sp = SamplingParams(temperature=0.0, max_tokens=p.max_tokens, ignore_eos=True, logprobs=2,
                            extra_args={"kv_transfer_params": dict(p.params)}
                            if p.params is not None else None)
        prompt = TokensPrompt(prompt_token_ids=list(p.ids))
        if p.salt is not None:
            prompt["cache_salt"] = p.salt
        rid = f"{name}-{served}"
        llm.llm_engine.add_request(rid, prompt, sp)
        return rid

    def run(p: Prompt, deadline_s: float) -> Output:
        """One request stepped by hand: its tokens and the time to its first one."""
        engine = llm.llm_engine
        t = time.perf_counter()
        rid = submit(p)
        first, last = 0.0, None
        while engine.has_unfinished_requests():
            if time.perf_counter() - t > deadline_s:
                engine.abort_request([rid])
                raise TimeoutError(f"request {rid} unfinished after {deadline_s} s")
            for o in engine.step():
                if o.outputs and o.outputs[0].token_ids and not first:
                    first = time.perf_counter() - t
                last = o
        return _output(last, time.perf_counter() - t, first)

    def together(prompts: list[Prompt], deadline_s: float) -> list[Output]:
        """Every prompt submitted at once, then stepped until all have finished."""
        engine = llm.llm_engine
        t = time.perf_counter()
        rids = [submit(p) for p in prompts]
        last: dict = {}
        while engine.has_unfinished_requests():
            if time.perf_counter() - t > deadline_s:
                engine.abort_request(rids)
                raise TimeoutError(f"requests {rids} unfinished after {deadline_s} s")
            for o in engine.step():
                last[o.request_id] = o
        return [_output(last.get(r), time.perf_counter() - t, 0.0) for r in rids]

    while True:
        cmd, arg = conn.recv()
        try:
            if cmd == "stop":  # the engine core and its worker go first; then no exit handler waits
                llm.llm_engine.engine_core.shutdown()
                conn.send(("ok", None))
                conn.close()
                os._exit(0)
            if cmd == "generate":
                prompts, deadline_s = arg
                conn.send(("ok", [run(p, deadline_s) for p in prompts]))
            elif cmd == "together":
                prompts, deadline_s = arg
                conn.send(("ok", together(prompts, deadline_s)))
            elif cmd == "metrics":
                if arg:  # a one-token request first: the gauges then describe the cache now
                    run(Prompt([1], 1, salt=f"probe-{served}"), 60.0)
                conn.send(("ok", _metrics(llm)))
            elif cmd == "abort_while_loading":  # a decode request aborted with its read in flight
                engine = llm.llm_engine
                rid = submit(arg)
                for _ in range(3):
                    engine.step()
                engine.abort_request([rid])
                t = time.perf_counter()
                while engine.has_unfinished_requests() and time.perf_counter() - t < 60:
                    engine.step()
                conn.send(("ok", time.perf_counter() - t))
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except Exception as e:  # noqa: BLE001
            import traceback
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _output(last, seconds: float, first: float) -> Output:
    c = last.outputs[0] if last is not None and last.outputs else None
    gaps, chosen = [], []
    for tok, lp in zip(c.token_ids, c.logprobs or []) if c is not None else []:
        top = sorted((v.logprob for v in lp.values()), reverse=True)
        gaps.append(top[0] - top[1] if len(top) > 1 else float("inf"))
        chosen.append(lp[tok].logprob if tok in lp else float("nan"))
    return Output(list(c.token_ids) if c else [], c.finish_reason if c else None,
                  last.kv_transfer_params if last is not None else None, seconds, first, gaps,
                  chosen)


def _metrics(llm) -> dict[str, float]:
    """vLLM's counters and gauges by name (summed over labels); histograms as _sum and _count."""
    vals: dict[str, float] = {}
    for m in llm.get_metrics():
        v = getattr(m, "value", None)
        if isinstance(v, (int, float)):
            vals[m.name] = vals.get(m.name, 0) + v
        elif hasattr(m, "sum") and hasattr(m, "count"):
            vals[m.name + "_sum"] = vals.get(m.name + "_sum", 0) + m.sum
            vals[m.name + "_count"] = vals.get(m.name + "_count", 0) + m.count
    return vals


@dataclass
class Engine:
    name: str
    proc: mp.Process
    conn: object
    start_s: float = 0.0
    prefix_caching: bool = True  # as the engine runs it (vLLM-CPU turns it off for some models)

    def _ask(self, cmd: str, arg=None, timeout_s: float = 600.0):
        self.conn.send((cmd, arg))
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"engine {self.name}: no answer to {cmd} in {timeout_s} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"engine {self.name}: {value}")
        return value

    def generate(self, prompts: list[Prompt], timeout_s: float = 600.0) -> list[Output]:
        """The prompts one after another; each request gives up (aborted) after timeout_s."""
        return self._ask("generate", (prompts, timeout_s), timeout_s * len(prompts) + 30)

    def together(self, prompts: list[Prompt], timeout_s: float = 600.0) -> list[Output]:
        """The prompts submitted at once (batched by the engine, reads in flight together)."""
        return self._ask("together", (prompts, timeout_s), timeout_s + 30)

    def metrics(self, probe: bool = False) -> dict[str, float]:
        """vLLM's metrics; probe: after a one-token request, so the cache gauges are current."""
        return self._ask("metrics", probe)

    def abort_while_loading(self, prompt: Prompt) -> float:
        return self._ask("abort_while_loading", prompt)

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("stop", None))
                self.conn.poll(timeout_s)
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(timeout_s)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its group is left
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.join(10)


@dataclass
class Engines:
    """Engine processes over one model; stopped (then killed if need be) on exit."""

    model: str
    engines: list[Engine] = field(default_factory=list)

    def start(self, name: str, block_size: int, core: int, role: str | None = "kv_both",
              connector: str = CONNECTOR, extra: dict | None = None, policy: str = "recompute",
              max_len: int = 1024, num_blocks: int | None = None, env: dict | None = None,
              wait: bool = True, dtype: str = "float32", v4: bool = False,
              timeout_s: float = 300.0, log_path: str | None = None) -> Engine:
        """v4: a DeepSeek-V4 engine (random weights, load_format "dummy") with the workarounds
        vllm-cpu 0.32 needs for V4 in its processes only (kvc_harness/v4_site/sitecustomize.py).
        log_path: the engine's output (vLLM's log, its errors) appended there, not to ours."""
        tier.check(f"a vLLM engine ({name})")
        env = dict(env or {})
        if v4:  # and weights of +-0.5, each seeded on its own (v4_site/sitecustomize.py)
            env["PYTHONPATH"] = os.pathsep.join(
                [V4_SITE] + [p for p in [os.environ.get("PYTHONPATH", "")] if p])
            env.setdefault("KVC_V4_DUMMY_RANGE", "0.5")
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_engine_main, name=f"engine-{name}", daemon=False,
                           args=(child, self.model, name, block_size, core, role, connector,
                                 dict(extra or {}), policy, max_len, num_blocks, env, dtype,
                                 "dummy" if v4 else "auto", log_path))
        proc.start()
        e = Engine(name, proc, parent)
        self.engines.append(e)
        if wait:
            self.wait(e, timeout_s)
        return e

    def wait(self, e: Engine, timeout_s: float = 300.0) -> Engine:
        if not e.conn.poll(timeout_s):
            raise TimeoutError(f"engine {e.name} did not start in {timeout_s} s")
        status, value = e.conn.recv()
        if status != "ready":
            raise RuntimeError(f"engine {e.name} failed to start: {value}")
        e.start_s, e.prefix_caching = value["start_s"], value["prefix_caching"]
        return e

    def __enter__(self) -> "Engines":
        if threading.current_thread() is threading.main_thread():  # a SIGTERM stops them too
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        for e in self.engines:
            e.stop()


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(f"signal {signum}")


def external_hits(e: "Engine") -> float:
    """vLLM's count of prompt tokens a connector supplied, on engine e so far."""
    return e.metrics().get("vllm:external_prefix_cache_hits", 0.0)


def has_amx() -> bool:
    """Whether this CPU has AMX tiles: vLLM-CPU then runs MLA on AMX_MLA (block sizes multiples
    of 32, prefix caching on), else on CPU_MLA (block 16 only, prefix caching off)."""
    return " amx_tile" in Path("/proc/cpuinfo").read_text()


def _stats_lines(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def read_stats(path: str) -> list[dict]:
    """The connector's stats lines (kv_connector_extra_config stats_path), one per read."""
    return [r for r in _stats_lines(path) if "refused" not in r]


def refusals(path: str) -> list[dict]:
    """The producer's lines in the same file: one per acquire it refused (refused: the reason)."""
    return [r for r in _stats_lines(path) if "refused" in r]


def make_v4_model(folder: str, compress_ratios: tuple[int, ...] = (0, 4, 128, 4)) -> str:
    """A tiny DeepSeek-V4 config (vLLM's own DeepseekV4Config fields; weights: vLLM's seeded
    "dummy" loader, the same in every engine) saved to `folder`: head_dim 512 (448 NoPE + 64
    RoPE), index_head_dim 128, index_topk 512 (vLLM asserts it), 64 routed experts top-6 (what
    the CPU routing kernels accept), hc_mult 4, DeepSeek's yarn rope_scaling."""
    cfg = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
           "torch_dtype": "bfloat16", "vocab_size": 1024, "hidden_size": 256,
           "moe_intermediate_size": 128, "num_hidden_layers": len(compress_ratios),
           "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 512,
           "qk_rope_head_dim": 64, "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128,
           "compress_ratios": list(compress_ratios), "compress_rope_theta": 160000.0,
           "sliding_window": 128, "index_n_heads": 8, "index_head_dim": 128, "index_topk": 512,
           "n_routed_experts": 64, "n_shared_experts": 1, "num_experts_per_tok": 6,
           "num_hash_layers": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.5,
           "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "swiglu_limit": 10.0,
           "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "hidden_act": "silu",
           "rms_norm_eps": 1e-06, "max_position_embeddings": 65536, "rope_theta": 10000.0,
           "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 16,
                            "original_max_position_embeddings": 4096, "beta_fast": 32,
                            "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
           "num_nextn_predict_layers": 0, "tie_word_embeddings": False, "bos_token_id": 0,
           "eos_token_id": 1}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return folder


def tiny_model_dir() -> str:
    return make_model(tempfile.mkdtemp(prefix="kvc-tiny-llama-"))
