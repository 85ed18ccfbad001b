"""Running from a checkout without installing (e.g. `python -m bench.speed.rounds` on a machine
with no network): the repository's sibling folders kernels/, cache/ and drafter/ are imported as
lanes.kernels, lanes.cache and lanes.drafter, the names an installed wheel gives them
(pyproject's package-dir). An installed or editable lanes never needs this: the finder is only
added when those folders sit beside this package and are not inside it.

From a checkout, the top-level name `kernels` is also a hazard: it is Hugging Face's
distribution too (transformers 5.25 requires it and imports it by that name), and with the
checkout's root on sys.path (`python -m pytest` or `python -m bench...` run there) the root's
kernels/ folder would be found first. A second finder looks for `kernels` everywhere but the
root first.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

SUBPACKAGES = ("kernels", "cache", "drafter")


class _SiblingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.partition(".")
        if parent != "lanes" or name not in SUBPACKAGES:
            return None  # submodules (lanes.kernels.matmul) resolve through the package's path
        folder = self.root / name
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


class _DistributionKernelsFinder(importlib.abc.MetaPathFinder):
    """`kernels` from sys.path without the checkout's root; None (the usual search, which finds
    the root's folder) where no such distribution is installed."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "kernels":
            return None
        elsewhere = [p for p in sys.path if Path(p or ".").resolve() != self.root]
        return importlib.machinery.PathFinder.find_spec(fullname, elsewhere)


def install(package_dir: Path) -> None:
    root = package_dir.parent
    inside = all((package_dir / n).is_dir() for n in SUBPACKAGES)
    beside = all((root / n / "__init__.py").is_file() for n in SUBPACKAGES)
    if not inside and beside and not any(isinstance(f, _SiblingFinder) for f in sys.meta_path):
        sys.meta_path.append(_SiblingFinder(root))
        sys.meta_path.insert(0, _DistributionKernelsFinder(root))
