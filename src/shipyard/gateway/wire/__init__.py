"""AWS's wire, shared by the edge, the API and the doors: botocore's service models and
request validation (``validation``), the action registry's names (``registry``), the query
protocol (``query``), the runtime headers' limits (``runtime_headers``) and the errors in
each door's shape (``errors``)."""
