"""The Open Inference Protocol (v2): one translation (``protocol``) under its REST door
(``rest``) and its gRPC server (``grpc``)."""
