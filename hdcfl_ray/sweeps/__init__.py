"""Sweeps: a grid of scenarios x algorithms x seeds, run (concurrently when the
cluster allows), indexed, and resumable. `hdcfl_ray.sweep(...)` (the Python API) and
`hdcfl-ray sweep` run them."""
