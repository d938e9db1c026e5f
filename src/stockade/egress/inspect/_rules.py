"""Request rules for inspected hosts: the pure :class:`~stockade.policy._rulematch.RuleSet`.

The rules are decided in L0 (:mod:`stockade.policy._rulematch`) so that the model
(:mod:`stockade.model`) and ``stockade explain`` judge a request exactly as the proxy
does; this module only names them for the inspect layer.
"""

from __future__ import annotations

from stockade.policy._rulematch import LAYER as LAYER
from stockade.policy._rulematch import RuleSet as RuleSet
from stockade.policy._rulematch import compile_glob as compile_glob

__all__ = ["LAYER", "RuleSet", "compile_glob"]
