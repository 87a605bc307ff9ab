"""The AWS control plane: its wire protocols and action registry (``control``), the
actions (``actions/``), what the gateway refuses and why (``unsupported``), the jobs REST
facade (``facade``) and the stack file's door (``stack_config``)."""
