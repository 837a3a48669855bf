"""Data: sources that decode a dataset once into uint8 arrays, partitioners that
split its training labels over clients, and the per-batch float transform."""
