"""Checkpoints: a run's server state, committed client states and progress, saved
without pickle so that resuming never executes code from a file."""
