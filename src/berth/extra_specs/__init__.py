"""Flavor extra specs: the operator grammar filters match with, and key validators.

:mod:`berth.extra_specs.ops` is the one implementation of Nova's ``extra_specs_ops``
grammar (``= 4``, ``s== x``, ``<in> aes``, ``<or> a <or> b``...);
:mod:`berth.extra_specs.validators` knows the keys Berth understands and checks a flavor
(``berth flavor check``).
"""

from berth.extra_specs.ops import Requirement, compile_requirement, match, validate_requirement

__all__ = ["Requirement", "compile_requirement", "match", "validate_requirement"]
