"""The public surface is exactly what `__all__` lists."""

from __future__ import annotations

import dispatcher
from dispatcher import examples, fleet, testing, tuning
from dispatcher._exports import rehome


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
    """Every exported class reports `dispatcher` as its home (not the private module that defines it)."""
    classes = [getattr(dispatcher, name) for name in dispatcher.__all__ if isinstance(getattr(dispatcher, name), type)]
    assert len(classes) > 20
    assert {cls.__name__: cls.__module__ for cls in classes} == {cls.__name__: "dispatcher" for cls in classes}
    for package in (examples, fleet, testing, tuning):
        for name in package.__all__:
            value = getattr(package, name)
            if isinstance(value, type):
                assert value.__module__ == package.__name__, name


def test_rehome_moves_only_the_package_classes_named_in_all() -> None:
    """`rehome` gives the module's name to the package's classes in `__all__`, and leaves the rest alone."""
    exported = type("Exported", (), {"__module__": "dispatcher._private"})
    unlisted = type("Unlisted", (), {"__module__": "dispatcher._private"})
    foreign = type("Foreign", (), {"__module__": "elsewhere"})
    namespace = {
        "__name__": "dispatcher.public",
        "__all__": ["Exported", "Foreign", "constant"],
        "Exported": exported,
        "Unlisted": unlisted,
        "Foreign": foreign,
        "constant": 3,
    }
    rehome(namespace)
    assert (exported.__module__, unlisted.__module__, foreign.__module__) == (
        "dispatcher.public",
        "dispatcher._private",
        "elsewhere",
    )


def test_the_types_of_public_signatures_are_exported() -> None:
    """The aliases public signatures use (an approver, a key function, a tool selector) can be imported."""
    from dispatcher import Approver, KeyFunction, ToolSelector

    assert "ApprovalRequest" in repr(Approver)
    assert "Mapping" in repr(KeyFunction)
    assert "tuple" in repr(ToolSelector)


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
