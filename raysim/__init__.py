"""raysim: a Ray-based parallel simulator for personalised federated learning."""

__version__ = "0.1.0"
