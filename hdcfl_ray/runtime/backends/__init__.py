"""Where a run's server and client hosts live: this process or Ray actors.
Importing this package imports neither Ray nor torch."""
