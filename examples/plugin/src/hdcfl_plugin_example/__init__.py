"""An example hdcfl-ray plugin package: one method, one partition, one data source."""

__version__ = "0.1.0"
