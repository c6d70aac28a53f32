"""Packages installed on demand: `await runtime.install("statsmodels")`.

The sandbox has no network and never resolves or downloads anything. It asks the bridge (an
`install` request), which resolves the requirements for this interpreter on the host, asks the
user when its `[packages]` policy says so, checks every wheel's sha256 and unpacks them into
PACKAGES_DIR: a read-only mount here, on `sys.path` after the image's own directories, so an
install can add modules but never replace the image's (numpy, pandas). `target()` is what the
`ready` frame says of this interpreter, before any code runs, for choosing its wheels.
"""

import importlib
import os
import platform
import sys

from . import rpc

PACKAGES_DIR = "/opt/packages"
# Distributions named in `ready` at most: an image has tens, a big one hundreds.
MAX_DISTS = 4000


# What a refused or failed install raises: defined by `rpc`, which raises them from the bridge's
# answer (`kind` "package_denied" / "package") and imports no module above it.
PackageError = rpc.PackageError
PackageDenied = rpc.PackageDenied


def _dist_of(entry):
    """(name, version) of a `.dist-info` / `.egg-info` directory name, or None."""
    for suffix in (".dist-info", ".egg-info"):
        if entry.endswith(suffix):
            stem = entry[: -len(suffix)]
            name, sep, rest = stem.partition("-")
            if not sep or not name:
                return None
            version = rest.split("-", 1)[0]
            return name, version
    return None


def dists():
    """The distributions the image has (outside PACKAGES_DIR), from their metadata directories'
    names: one directory listing per `sys.path` entry, no metadata parsed."""
    found = {}
    for d in sys.path:
        if not d or not os.path.isdir(d) or os.path.realpath(d).startswith(PACKAGES_DIR):
            continue
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for e in entries:
            nv = _dist_of(e)
            if nv and nv[0].lower() not in found:
                found[nv[0].lower()] = nv
                if len(found) >= MAX_DISTS:
                    return sorted(found.values())
    return sorted(found.values())


def target():
    """What this interpreter is, for the bridge to choose wheels for it."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        libc = ""
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "libc": libc,
        "dists": [list(nv) for nv in dists()],
    }


def add_to_path():
    """PACKAGES_DIR last on `sys.path`: what is installed never shadows the image."""
    if PACKAGES_DIR not in sys.path:
        sys.path.append(PACKAGES_DIR)


async def install(*requirements):
    """Install distributions into this session: `await runtime.install("statsmodels",
    "openpyxl==3.1.5")`. Only names with optional extras and version clauses are accepted (no
    URL, path or option). The bridge resolves them with their dependencies for this
    interpreter, from its configured index, and may ask the user first. Returns what was
    installed: [{name, version, cached, size}] (`cached`: taken from the host's cache with no
    download). Afterwards `import` finds them in this session; a new session starts without
    them (unless the bridge's packages.preinstall lists them). Raises PackageDenied (a
    PermissionError) when refused, PackageError when the install fails."""
    if len(requirements) == 1 and isinstance(requirements[0], (list, tuple)):
        requirements = tuple(requirements[0])
    for r in requirements:
        if not isinstance(r, str):
            raise TypeError("install() takes requirement strings, such as \"tabulate==0.9.0\", not %s" % type(r).__name__)
    if not requirements:
        raise TypeError("install() needs at least one requirement, such as \"tabulate\"")
    result = await rpc.request("install", {"requirements": list(requirements)})
    importlib.invalidate_caches()
    return [dict(i) for i in (result or {}).get("installed") or () if isinstance(i, dict)]


def installed():
    """What this session installed so far: [{name, version, requested}] (`requested`: named by
    an install, not only a dependency)."""
    result = rpc.request_sync("installed", {}) or {}
    return [dict(i) for i in result.get("installed") or () if isinstance(i, dict)]
