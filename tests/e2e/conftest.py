"""Fixtures and hooks of the e2e suite; their code is in e2e_env.py, which tests import by name
(a `from conftest import ...` would pick whichever conftest.py pytest loaded last)."""

from e2e_env import env, pytest_collection_modifyitems  # noqa: F401
