"""No handlers at all: the runtime's defaults decode JSON, pass it through and encode it."""
