"""Models (encoders plus a linear head) and the flat vectors their parameters travel as."""

from hdcfl_ray.models.encoders import build_encoder
from hdcfl_ray.models.flat import FlatEntry, FlatIndex, flatten_module, load_flat_into, unflatten
from hdcfl_ray.models.split_model import SplitModel, build_split_model, count_parameters

__all__ = [
    "FlatEntry",
    "FlatIndex",
    "SplitModel",
    "build_encoder",
    "build_split_model",
    "count_parameters",
    "flatten_module",
    "load_flat_into",
    "unflatten",
]
