#!/usr/bin/env python3
"""--version and usage errors on every program kolo installs (issue 22, 5).

Arguments: --root DIR --version X.Y.Z TARGET=PATH...  (the built programs;
TARGET= for one this configuration does not build).
The installed programs are read from the CMakeLists.txt files
(install(TARGETS ... RUNTIME ...)), so a new program without a PATH here
fails the test. For each program:
  PROGRAM --version        exit 0, one line "NAME ... X.Y.Z" on stdout
  PROGRAM --no-such-flag   exit 2, stderr starts "NAME: " and points to --help
NAME is the file name (the kolo_cli target installs `kolo`).
"""
import argparse
import os
import re
import subprocess
import sys

INSTALL_RE = re.compile(r"install\(TARGETS\s+([^)]*?)\s+RUNTIME", re.S)


def installed_programs(root):
    names = set()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build")) and d != "third_party"]
        if "CMakeLists.txt" in files:
            with open(os.path.join(dirpath, "CMakeLists.txt")) as f:
                for m in INSTALL_RE.finditer(f.read()):
                    names |= {t for t in m.group(1).split() if t != "EXPORT"}
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("programs", nargs="*", metavar="TARGET=PATH")
    a = ap.parse_args()
    progs = dict(p.split("=", 1) for p in a.programs)
    errors = []
    missing = sorted(installed_programs(a.root) - set(progs))
    if missing:
        errors.append(f"installed but not given to this test (not built?): {missing}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOLO_", "HOROVOD_"))}
    for target, path in sorted(progs.items()):
        if not path:
            print(f"{target}: not built in this configuration, skipped")
            continue
        name = os.path.basename(path)
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                           env=env, stdin=subprocess.DEVNULL)
        lines = r.stdout.splitlines()
        if r.returncode != 0 or len(lines) != 1 or not lines[0].startswith(f"{name} ") or \
                not lines[0].endswith(f" {a.version}"):
            errors.append(f"{name} --version: exit {r.returncode}, stdout {r.stdout!r}, "
                          f"stderr {r.stderr[-300:]!r}; want exit 0 and one line "
                          f"'{name} ... {a.version}'")
        r = subprocess.run([path, "--no-such-flag"], capture_output=True, text=True, timeout=30,
                           env=env, stdin=subprocess.DEVNULL)
        if r.returncode != 2 or not r.stderr.startswith(f"{name}: ") or \
                "--help" not in r.stderr:
            errors.append(f"{name} --no-such-flag: exit {r.returncode}, stderr "
                          f"{r.stderr[-300:]!r}; want exit 2 and a line '{name}: ...' that "
                          "points to --help")
        else:
            print(f"{name}: --version ok; usage error: exit 2: {r.stderr.strip().splitlines()[0]}")
    for e in errors:
        print(f"FAIL {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
