"""Fleets: starting a model's instances on a backend, waiting for them, stopping them.

Below both the endpoint reconciler (``control/``) and batch transform (``transform/``),
which each provision instances through it.
"""
