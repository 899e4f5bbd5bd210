"""AppWrapper dispatcher: gang dispatch of wrapped Kubernetes workloads."""

__version__ = "0.1.0"
