"""The examples in eqsat's docstrings run, and show what they say."""

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import eqsat


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(eqsat.__path__, "eqsat."):
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and spec.origin.endswith(".py") and \
                ">>>" in Path(spec.origin).read_text():
            names.append(info.name)
    return names


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    assert {"eqsat.rules", "eqsat.extract.egraph"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS,
                             verbose=False, report=True)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
