"""Federated methods, one module each (a module is a method when it declares
`METHOD = MethodSpec(...)`; the contract is hdcfl_ray.contract), and the maths
private to each, in modules named after their method (fedala_weights,
fedsoft_importance, pacfl_subspaces) or shared (aggregate, proximal,
cluster_models, async_mixing). `registry` finds the methods by name."""
