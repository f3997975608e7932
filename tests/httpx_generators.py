"""The one filter for the httpx async generators that the SDK's HTTP client leaves unclosed under trio.

Under trio, the SDK's streamable HTTP client leaves httpx async generators unclosed when a connection
breaks, when a storm of messages ends, and on the legacy handshake even when it exits normally (a plain
``async with Client(url, mode="legacy")`` shows it). trio finalizes each one itself, but its asyncgen hook
first warns (a ``ResourceWarning``), and with ``filterwarnings = ["error"]`` that surfaces as an unraisable
exception warning that fails the test. Not ours to fix: the tests of HTTP under trio ignore exactly those
generators, by name, and nothing else.

Which generator is left depends on the httpx2/httpcore2 release: with 2.13.1 the unclosed one is
``PoolByteStream.__aiter__`` (or ``EventSource``'s or ``Response``'s); with 2.17.0, whose ``PoolByteStream``
hands out its connection stream's generator as is and whose ``Response.aiter_raw`` no longer wraps it in
``aclosing``, it is ``HTTP11ConnectionByteStream.__aiter__``. A fresh install takes the newest release, so
the filter names both.
"""

from __future__ import annotations

import pytest

HTTPX_GENERATORS = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <async_generator object "
    r"(EventSource|PoolByteStream|HTTP11ConnectionByteStream|Response)\.\w+:pytest.PytestUnraisableExceptionWarning"
)
"""Ignore the unraisable ResourceWarnings of exactly those httpx generators (a mark for a test or a param)."""
