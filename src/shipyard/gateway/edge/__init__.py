"""The edge: what every request meets before a door. Heads read once, the browser rules,
SigV4 and the keys' scopes (``auth``, ``signatures``, ``browser``), and the wrapper that
puts them around the doors (``assembly``). What it decides reaches the doors as a value
(``auth.admitted``)."""
