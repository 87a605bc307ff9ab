"""HTTP/1.1 with nothing of shipyard in it: the gateway's server protocol and its limits
(``server``), the path router (``paths``), bodies read whole within limits (``bodies``),
AWS event-stream framing (``eventstream``), the pooled client that reaches instances
(``client``), the instance's direct protocol (``direct``), lazy keep-alive and coalesced
writes (``keepalive``, ``writes``), and the server's assembly (``serving``); beside
them, HTTP/2 for bidirectional streams (``h2server``) and the WebSocket client that
carries each stream to its instance (``wsclient``).

It imports nothing of shipyard above ``shipyard.errors`` (an import-linter contract in
``pyproject.toml`` holds it there), so each piece can be read, tested and replaced as
plain HTTP."""
