"""MLServer peer for the OIP bench: the same LogisticRegression pickle, one [n, 20] FP64
input "instances" in, one INT64 output "predictions" out, over MLServer's REST and gRPC."""

import pickle

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Sklearn(MLModel):
    async def load(self) -> bool:
        with open(self.settings.parameters.uri, "rb") as f:
            self.model = pickle.load(f)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        rows = NumpyCodec.decode_input(payload.inputs[0])
        out = NumpyCodec.encode_output("predictions", self.model.predict(rows))
        return InferenceResponse(model_name=self.name, outputs=[out])
