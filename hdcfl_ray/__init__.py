"""hdcfl-ray: a federated-learning simulator on Ray for personalised FL research."""

__version__ = "0.1.0"
