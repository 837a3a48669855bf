"""Federated algorithms, one module each, behind the interface in `base`;
`registry.build_algorithm` picks one from a scenario."""
