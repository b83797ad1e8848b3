"""Host weighers. ``from berth import weighers`` then ``weighers.BaseHostWeigher`` replaces
Nova's ``from nova.scheduler import weights`` / ``weights.BaseHostWeigher``.

``all_weighers()`` returns every built-in weigher class (registry in
:mod:`berth.weighers.registry`); :func:`normalize` is Nova's normalization.
"""

from berth.weighers.base import BaseHostWeigher, WeighedHost, normalize


def all_weighers() -> list[type[BaseHostWeigher]]:
    """Every built-in weigher class (what ``berth.weighers.all_weighers`` names in config)."""
    from berth.weighers.registry import builtin_weigher_classes

    return builtin_weigher_classes()


__all__ = ["BaseHostWeigher", "WeighedHost", "all_weighers", "normalize"]
