"""Newer Debian packages beside the system's, unpacked with their own C library: Mesa 26's
lavapipe (Mesa's Vulkan driver on the CPU) for the Vulkan tests of cooperative matrices, and
SPIRV-Cross 1.4.357 for Metal's simdgroup matrices. Debian 12's lavapipe (Mesa 22.3) has no
VK_KHR_cooperative_matrix, nor does its backport (25.0); Mesa 26 in Debian 13's backports has
it (8 x 8 x 8 f16 tiles). Debian 12's SPIRV-Cross (2021) and 13's (1.4.304) throw on cooperative
matrices; the Vulkan SDK 1.4.350's and newer (Debian unstable's) write them as simdgroup
matrices. Both need Debian 13's C library, so the packages and their dependencies (C library
included, about 300 MB unpacked) go into a directory, and programs run under that C library's
loader with the unpacked libraries first: the driver loads, and so does everything else (a newer
glibc runs programs built for an older one). Nothing is installed on the system.

    .venv/bin/python scripts/newer_debian.py fetch [--dir DIR]   # download and unpack (once)
    .venv/bin/python scripts/newer_debian.py run [--dir DIR] -- .venv/bin/python -m pytest test/test_vulkan.py
    .venv/bin/python scripts/newer_debian.py status [--dir DIR]  # what is there, or why not
    TRACEA_SPIRV_CROSS=.cache/newer-debian/bin/spirv-cross ...   # the Metal target's MSL through it

`run` makes the newer lavapipe the only Vulkan device. DIR defaults to .cache/newer-debian in the
repository. Packages come from deb.debian.org (trixie-backports for Mesa, sid for SPIRV-Cross,
trixie for the rest), each checked against its index's SHA-256; the indexes' current versions
are taken (the archive keeps no old ones), and the versions unpacked are recorded in DIR/ready.
x86_64 Linux only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

MAIN = Path(__file__).resolve().parent.parent
DEFAULT_DIR = MAIN / ".cache" / "newer-debian"
MIRROR = "http://deb.debian.org/debian"
SUITES = {"trixie-backports": ("mesa-vulkan-drivers",), "sid": ("spirv-cross",), "trixie": ()}  # suite: packages taken from it first
WANTED = ("mesa-vulkan-drivers", "libvulkan1", "spirv-cross")
# dependencies the driver never loads (package scripts, configuration)
NOT_NEEDED = {"debconf", "debconf-2.0", "perl-base", "dpkg", "libc-bin", "init-system-helpers"}
LOADER = "usr/lib64/ld-linux-x86-64.so.2"
LIBRARIES = "usr/lib/x86_64-linux-gnu"


def _index(suite: str) -> dict[str, dict[str, str]]:
    """The suite's amd64 package index: package -> its fields."""
    with urllib.request.urlopen(f"{MIRROR}/dists/{suite}/main/binary-amd64/Packages.xz", timeout=120) as r:
        text = lzma.decompress(r.read()).decode()
    packages = {}
    for block in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", block, re.M))
        if "Package" in fields:
            packages[fields["Package"]] = fields
    return packages


def _satisfies(version: str, constraint: str) -> bool:
    """Whether a Debian version meets a dependency's constraint (">= 2.39"; "" meets anything)."""
    if not constraint:
        return True
    op, wanted = constraint.split()
    op = {">=": "ge", "<=": "le", ">>": "gt", "<<": "lt", "=": "eq"}[op]
    return subprocess.run(["dpkg", "--compare-versions", version, op, wanted]).returncode == 0


def _closure(indexes: dict[str, dict]) -> list[dict[str, str]]:
    """The wanted packages and everything they depend on (first alternative of each), each from
    the first suite that should provide it (trixie for the rest) whose version meets what asked
    for it, else from sid (a newer C library, say, when an unstable package needs one)."""
    provides = {}
    for suite in indexes.values():
        for name, fields in suite.items():
            for virtual in re.findall(r"([\w.+-]+)", fields.get("Provides", "")):
                provides.setdefault(virtual, name)
    chosen, todo = {}, [(name, "") for name in WANTED]
    while todo:
        name, constraint = todo.pop()
        if name in NOT_NEEDED or (name in chosen and _satisfies(chosen[name]["Version"], constraint)):
            continue
        suites = [s for s, first in SUITES.items() if name in first] + ["trixie", "sid"]
        real = name if any(name in indexes[s] for s in suites) else provides.get(name)
        fields = next((indexes[s][real] for s in suites if real in indexes[s]
                       and _satisfies(indexes[s][real]["Version"], constraint)), None)
        if fields is None:
            raise SystemExit(f"newer_debian: no package {name} {constraint} in {', '.join(SUITES)}")
        chosen[name] = fields
        for dependency in (fields.get("Depends", "") + "," + fields.get("Pre-Depends", "")).split(","):
            first = re.match(r"\s*([^\s(|:]+)(?::\w+)?\s*(?:\(([^)]*)\))?", dependency.split("|")[0])
            if first:
                todo.append((first.group(1), first.group(2) or ""))
    return list(chosen.values())


def fetch(directory: Path) -> str:
    """Download and unpack the packages into `directory` (nothing when they are there); the versions
    of the driver and of SPIRV-Cross, a line each."""
    ready = directory / "ready"
    if ready.exists():
        return ready.read_text().strip()
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise SystemExit(f"newer_debian: x86_64 Linux only (this is {platform.system()} {platform.machine()})")
    if shutil.which("dpkg-deb") is None:
        raise SystemExit("newer_debian: needs dpkg-deb (Debian's dpkg) to unpack the packages")
    indexes = {suite: _index(suite) for suite in SUITES}
    packages = _closure(indexes)
    staging = Path(tempfile.mkdtemp(prefix="newer-debian-", dir=directory.parent if directory.parent.exists() else None))
    try:
        root = staging / "root"
        for i, fields in enumerate(packages, 1):
            print(f"newer_debian: [{i}/{len(packages)}] {fields['Package']} {fields['Version']}", file=sys.stderr)
            deb = staging / Path(fields["Filename"]).name
            with urllib.request.urlopen(f"{MIRROR}/{fields['Filename']}", timeout=300) as r:
                data = r.read()
            if hashlib.sha256(data).hexdigest() != fields["SHA256"]:
                raise SystemExit(f"newer_debian: {deb.name} does not match the index's SHA-256")
            deb.write_bytes(data)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            deb.unlink()
        icd = json.loads((root / "usr/share/vulkan/icd.d/lvp_icd.json").read_text())
        icd["ICD"]["library_path"] = str(directory / "root" / LIBRARIES / "libvulkan_lvp.so")
        (staging / "lvp_icd.json").write_text(json.dumps(icd, indent=2))
        (staging / "bin").mkdir()
        wrapper = staging / "bin" / "spirv-cross"
        wrapper.write_text("#!/bin/sh\n# SPIRV-Cross from Debian unstable under its C library (scripts/newer_debian.py)\n"
                           f'exec {" ".join(command(directory, [str(directory / "root/usr/bin/spirv-cross")])[0])} "$@"\n')
        wrapper.chmod(0o755)
        smoke = subprocess.run(command(staging, [str(staging / "root/usr/bin/spirv-cross"), "--help"])[0],
                               capture_output=True, text=True)
        if smoke.returncode not in (0, 1) or "Usage" not in smoke.stdout + smoke.stderr:
            raise SystemExit(f"newer_debian: the unpacked SPIRV-Cross does not run: {smoke.stderr.strip()[:300]}")
        versions = {p["Package"]: p["Version"] for p in packages}
        (staging / "ready").write_text("".join(f"{name} {versions[name]}\n" for name in ("mesa-vulkan-drivers",
                                                                                          "spirv-cross")))
        if directory.exists():
            shutil.rmtree(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(directory)  # whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ready.read_text().strip()


def command(directory: Path, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """argv (a program and its arguments) run under the unpacked C library, with the newer driver
    as the only Vulkan device: the command line and its environment."""
    root = directory / "root"
    env = dict(os.environ, VK_ICD_FILENAMES=str(directory / "lvp_icd.json"), TRACEA_NEWER_DEBIAN=str(directory))
    env.pop("VK_DRIVER_FILES", None)  # the newer loader's name for VK_ICD_FILENAMES, which it prefers
    return [str(root / LOADER), "--library-path", f"{root / LIBRARIES}:/usr/lib/x86_64-linux-gnu", *argv], env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("action", choices=["fetch", "run", "status"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"where it is unpacked (default {DEFAULT_DIR})")
    parser.usage = "%(prog)s [-h] [--dir DIR] {fetch,run,status} [-- PROGRAM [ARGS ...]]"
    # what follows `--` is run's program, split off first: an argparse remainder would also
    # swallow options given after the action (`fetch --dir DIR`)
    raw = sys.argv[1:]
    cut = raw.index("--") if "--" in raw else len(raw)
    args, program = parser.parse_args(raw[:cut]), raw[cut + 1:]
    directory = args.dir.resolve()
    if args.action == "fetch":
        print(f"newer_debian: {', '.join(fetch(directory).splitlines())} in {directory}")
    elif args.action == "status":
        ready = directory / "ready"
        print(f"newer_debian: {', '.join(ready.read_text().split(chr(10))[:-1])} in {directory}" if ready.exists()
              else f"newer_debian: not fetched ({directory}); run: {sys.argv[0]} fetch")
    else:
        if not program:
            parser.error("run needs a program: run -- PROGRAM [ARGS]")
        if not (directory / "ready").exists():
            raise SystemExit(f"newer_debian: not fetched ({directory}); run: {sys.argv[0]} fetch")
        cmd, env = command(directory, program)
        os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
