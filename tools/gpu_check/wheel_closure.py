"""Check that the carried wheels and the GPU image's packages together meet what
paralela (with its torch, sweep and serve extras) and each wheel require, for CPython
3.12 on x86-64 Linux. ``tools/gpu-check.sh --wheels`` runs it after the download.

Usage: wheel_closure.py WHEEL_DIR PYPROJECT IMAGE_PACKAGE...
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "implementation_name": "cpython",
    "os_name": "posix",
    "extra": "",
}
EXTRAS = ("torch", "sweep", "serve")  # what the checks use


def wheel_requirements(wheel: Path) -> tuple[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    found = re.search(r"^Name: (.+)$", metadata, re.MULTILINE)
    if found is None:
        raise SystemExit(f"{wheel}: no Name in its METADATA")
    return found.group(1), re.findall(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE)


def main() -> None:
    wheel_dir, pyproject, *image = sys.argv[1:]
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    needs = {"paralela": [*project["dependencies"]]}
    for extra in EXTRAS:
        needs["paralela"] += project["optional-dependencies"][extra]
    for wheel in sorted(Path(wheel_dir).glob("*.whl")):
        name, requirements = wheel_requirements(wheel)
        needs[name] = requirements
    present = {canonicalize_name(n) for n in [*needs, *image]} - {"paralela"}
    missing = []
    for owner, requirements in needs.items():
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate(TARGET):
                continue
            if canonicalize_name(requirement.name) not in present:
                missing.append(f"{requirement} (for {owner})")
    if missing:
        raise SystemExit(
            "gpu-wheels: neither the wheels nor the GPU image provide: "
            + "; ".join(missing)
            + ". Add them to WHEELS in tools/gpu-check.sh."
        )
    print(f"gpu-wheels: every requirement is met ({len(needs) - 1} wheels and the image)")


if __name__ == "__main__":
    main()
