"""Batch transform: input objects through a model's instances, record by record."""
