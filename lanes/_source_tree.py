"""Running from a checkout without installing (e.g. `python -m bench.bench_rounds` on a machine
with no network): the repository's sibling folders kernels/, cache/ and drafter/ are imported as
lanes.kernels, lanes.cache and lanes.drafter, the names an installed wheel gives them
(pyproject's package-dir). An installed or editable lanes never needs this: the finder is only
added when those folders sit beside this package and are not inside it.
"""

from __future__ import annotations

import importlib.abc
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


def install(package_dir: Path) -> None:
    root = package_dir.parent
    inside = all((package_dir / n).is_dir() for n in SUBPACKAGES)
    beside = all((root / n / "__init__.py").is_file() for n in SUBPACKAGES)
    if not inside and beside and not any(isinstance(f, _SiblingFinder) for f in sys.meta_path):
        sys.meta_path.append(_SiblingFinder(root))
