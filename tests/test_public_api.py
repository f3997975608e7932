"""The public surface is exactly what `__all__` lists."""

from __future__ import annotations

import dispatcher


def test_all_is_sorted_and_complete() -> None:
    """`__all__` is sorted, and every public attribute of the package is in it (and nothing else)."""
    assert dispatcher.__all__ == sorted(dispatcher.__all__)
    public = {
        name
        for name, value in vars(dispatcher).items()
        if not name.startswith("_") and not isinstance(value, type(dispatcher))
    }
    assert public == set(dispatcher.__all__)


def test_public_names_come_from_the_package() -> None:
    """Every exported name is defined in dispatcher's own modules and reports the package as its home."""
    for name in dispatcher.__all__:
        value = getattr(dispatcher, name)
        assert getattr(value, "__module__", "dispatcher").startswith("dispatcher")


def test_tuning_module_exports_the_sweep() -> None:
    """`dispatcher.tuning` exposes the sweep and its report, each defined in the package."""
    import dispatcher.tuning

    assert dispatcher.tuning.__all__ == sorted(dispatcher.tuning.__all__)
    for name in dispatcher.tuning.__all__:
        assert hasattr(dispatcher.tuning, name)


def test_reconnect_policy_is_a_frozen_keyword_only_config() -> None:
    """`ReconnectPolicy` is exported and, like `RetryPolicy`, a frozen keyword-only dataclass with slots."""
    import dataclasses

    import pytest

    policy = dispatcher.ReconnectPolicy(wait_initial=0.5)
    assert dataclasses.is_dataclass(policy) and hasattr(dispatcher.ReconnectPolicy, "__slots__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.wait_initial = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        dispatcher.ReconnectPolicy(0.5)  # type: ignore[call-arg]
