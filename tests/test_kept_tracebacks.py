"""A package's module-level exceptions must not keep their importer's frames alive
(tepo_cli/rollout/kept_tracebacks.py)."""

from __future__ import annotations

import gc
import sys
import types
import weakref

from tepo_cli.rollout.kept_tracebacks import drop_kept_tracebacks


class Marker:
    """A local of the importing frame, weakly referenced to see when it is freed."""


def _import_a_module_that_keeps_its_exception(name: str) -> weakref.ref:
    marker = Marker()  # what the caller's frame holds, as MPO's warm-up held its optimizer
    module = types.ModuleType(name)
    try:
        try:
            raise RuntimeError("first")
        except RuntimeError as first:
            raise ImportError("optional dependency missing") from first
    except ImportError as error:
        module.kept = error  # vLLM's audio module keeps torchcodec's ImportError like this
    sys.modules[name] = module
    return weakref.ref(marker)


def test_the_importers_locals_outlive_it_until_the_tracebacks_are_dropped():
    alive = _import_a_module_that_keeps_its_exception("tepo_kept_pkg.audio")
    try:
        gc.collect()
        assert alive() is not None  # the traceback keeps the frame, the frame its marker
        assert drop_kept_tracebacks("tepo_kept_pkg") == 2  # the error and its cause
        gc.collect()
        assert alive() is None
        kept = sys.modules["tepo_kept_pkg.audio"].kept
        assert str(kept) == "optional dependency missing" and kept.__traceback__ is None
        assert kept.__cause__.__traceback__ is None and str(kept.__cause__) == "first"
        assert drop_kept_tracebacks("tepo_kept_pkg") == 0
    finally:
        del sys.modules["tepo_kept_pkg.audio"]


def test_other_packages_are_left_alone():
    alive = _import_a_module_that_keeps_its_exception("tepo_other_pkg")
    try:
        assert drop_kept_tracebacks("tepo_kept_pkg") == 0
        gc.collect()
        assert alive() is not None
        assert sys.modules["tepo_other_pkg"].kept.__traceback__ is not None
    finally:
        del sys.modules["tepo_other_pkg"]
