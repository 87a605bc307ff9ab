"""shipyard: self-hosted model serving that speaks the SageMaker API."""

__version__ = "0.1.0"
