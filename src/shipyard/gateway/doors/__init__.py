"""The data-plane doors, one module (or package) each, none importing another: the
runtime (``runtime``), the response stream (``streaming``), asynchronous invocations
(``async_invocations``), the Open Inference Protocol over REST and gRPC (``oip``) and the
OpenAI-compatible door (``openai``). What they share is ``endpoint`` (reach, bodies,
limits, session headers) and ``relay`` (relaying a streamed answer)."""
