"""`python -m hdcfl_ray.portable`: the portable environment as NAME=VALUE lines, for
starting a Python session that runs portable scenarios through the Python API:

    env $(python -m hdcfl_ray.portable) python my_script.py
"""

from hdcfl_ray.portable.environment import portable_environment

for name, value in portable_environment().items():
    print(f"{name}={value}")
