"""The built-in Python runtime: one process serving one model instance.

It speaks the SageMaker container contract (``GET /ping``, ``POST /invocations``) and
calls the inference toolkit's handlers from the artifact's ``code/inference.py``:

    python -m shipyard.runtime --port PORT --model-dir DIR [--host 127.0.0.1]
                               [--error-file PATH]

The model is loaded before the port is opened, so a ``/ping`` that answers means a loaded
model. If loading fails the process writes ``<ExcType>: <message>`` to ``--error-file``
(the endpoint's FailureReason) and exits with code 1.

Nothing is imported here: the gateway may import ``shipyard.runtime`` names without
paying for uvicorn, and the instance process starts as fast as it can.
"""
