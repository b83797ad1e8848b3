"""Flavor extra specs: the operator grammar filters match with, and key validators.

:mod:`berth.extra_specs.ops` is the one implementation of Nova's ``extra_specs_ops``
grammar (``= 4``, ``s== x``, ``<in> aes``, ``<or> a <or> b``...);
:mod:`berth.extra_specs.validators` knows the keys Berth understands and checks a flavor
(``berth flavor check``). A plugin's ``register()`` returns
``[berth.extra_specs.ExtraSpecValidator(name=..., description=..., value={...})]``.
"""

from typing import Any

from berth.extra_specs.ops import Requirement, compile_requirement, match, validate_requirement

_LAZY = {"ExtraSpecValidator", "check_flavor"}


def __getattr__(name: str) -> Any:
    # The validators pull in the os-traits catalogue; filters only need the grammar, so
    # the validators module is imported on first use.
    if name in _LAZY:
        from berth.extra_specs import validators

        return getattr(validators, name)
    raise AttributeError(f"module 'berth.extra_specs' has no attribute {name!r}")


__all__ = [
    "ExtraSpecValidator",
    "Requirement",
    "check_flavor",
    "compile_requirement",
    "match",
    "validate_requirement",
]
