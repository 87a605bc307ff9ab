"""Operations: ``/healthz`` and ``/metrics`` (``routes``), and the metrics of a gateway's
workers gathered into one page (``worker_metrics``)."""
