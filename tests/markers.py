"""Skip markers shared by test modules: a test that needs an optional extra skips where the extra
is not installed (the README's `make test` after `make train`), and CI, which installs it, sets
the variable that turns the skip into a failure."""

from __future__ import annotations

import importlib.util
import os

import pytest

needs_vllm = pytest.mark.skipif(
    os.environ.get("TEPO_REQUIRE_VLLM") != "1" and importlib.util.find_spec("vllm") is None,
    reason="rollout=vllm needs `make install-vllm`",
)
