"""Opacus, the `dp` extra the accountant needs, imported only when an epsilon is asked for
(it brings torch with it), and the error that says how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

from hdcfl_ray.errors import ScenarioError

INSTALL_HINT = "pip install 'hdcfl-ray[dp]'"


class PrivacyExtraMissing(ScenarioError, ImportError):
    """Opacus could not be imported: the message says which extra installs it. A
    ScenarioError (the CLI exits with code 2 and the message) and an ImportError."""


def opacus_accountants() -> ModuleType:
    """`opacus.accountants` (RDPAccountant, PRVAccountant), or PrivacyExtraMissing."""
    try:
        return importlib.import_module("opacus.accountants")
    except ImportError as error:
        raise PrivacyExtraMissing(
            f"privacy accounting needs Opacus, which could not be imported ({error}): {INSTALL_HINT}"
        ) from error
