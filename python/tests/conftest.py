"""Shared by the tests of the developer scripts in scripts/: loads one as a module."""

import importlib.util
import pathlib

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="session")
def load_script():
    """load_script("name.py") -> the script scripts/name.py as a module (its main() not run)."""

    def load(name):
        spec = importlib.util.spec_from_file_location("treemla_" + name.replace("-", "_")[:-3],
                                                      SCRIPTS / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
