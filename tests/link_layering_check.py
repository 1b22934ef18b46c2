#!/usr/bin/env python3
"""The link-level layering check: no library calls a function that only a library above it defines.

tests/layering_check.py reads #include lines, so it cannot see a header of a low floor that declares
a function a higher floor defines: the include goes down, the call goes up at link time. This check
reads the built libraries instead (nm): every symbol a folder's library leaves undefined must be
defined (strongly: nm types T, D, B, R) in its own library, a library of a floor below, or outside
Strata (system libraries). The floors are those of tests/layering_check.py.

Usage: link_layering_check.py BUILD_DIR    checks build/<folder>/libstrata_<folder>.a
       link_layering_check.py --self-test  builds two small libraries with cc and shows an upward
                                           call is caught and a downward one is not
KNOWN lists upward calls allowed for now, each with its reason (today none: every call goes down); the
check fails on a new one and on a KNOWN entry that no longer occurs, so the list cannot go stale.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layering_check import FLOOR_OF  # noqa: E402

STRONG = set("TDBR")
# nm's posix format: NAME TYPE [VALUE [SIZE]]; a demangled NAME may hold spaces, TYPE is one letter
# and only hexadecimal fields follow it.
POSIX_LINE = re.compile(r"^(?P<name>.+?) (?P<type>[A-Za-z])(?: [0-9a-f]*)*\s*$")
# (caller folder, callee folder, demangled symbol prefix): why it is allowed for now. Empty: no
# library calls up; an entry needs a reason and goes as soon as its call does.
KNOWN = {}


def nm_symbols(lib, undefined):
    """Demangled global symbols of a static library: (type, name) pairs."""
    args = ["nm", "-C", "-g", "--format=posix"] + (["-u"] if undefined else ["--defined-only"]) + [lib]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    symbols = []
    for line in out.splitlines():
        m = POSIX_LINE.match(line)
        if m:  # "lib.a[member.o]:" headers do not match
            symbols.append((m.group("type"), m.group("name")))
    return symbols


def libraries(build):
    libs = {}
    for folder in FLOOR_OF:
        path = os.path.join(build, folder, f"libstrata_{folder}.a")
        if os.path.exists(path):
            libs[folder] = path
    return libs


def upward_calls(libs):
    """(caller, callee, symbol) for each symbol a library needs that only a higher or sideways one defines."""
    defined_in = {}
    for folder, lib in libs.items():
        for kind, name in nm_symbols(lib, undefined=False):
            if kind in STRONG:
                defined_in.setdefault(name, set()).add(folder)
    found = set()
    for folder, lib in libs.items():
        own = {name for kind, name in nm_symbols(lib, undefined=False)}
        for _, name in nm_symbols(lib, undefined=True):
            if name in own or name not in defined_in:
                continue
            homes = defined_in[name]
            if any(FLOOR_OF[h] < FLOOR_OF[folder] for h in homes):
                continue
            for h in homes:
                if h != folder:
                    found.add((folder, h, name))
    return found


def known_reason(call):
    caller, callee, name = call
    for (k_caller, k_callee, prefix), why in KNOWN.items():
        if caller == k_caller and callee == k_callee and name.startswith(prefix):
            return why
    return None


def check(build):
    libs = libraries(build)
    if len(libs) < len(FLOOR_OF):
        missing = sorted(set(FLOOR_OF) - set(libs))
        print(f"link_layering_check: {build}: no library for {', '.join(missing)}; build first (cmake --build)")
        return 1
    calls = upward_calls(libs)
    new = sorted(c for c in calls if known_reason(c) is None)
    for caller, callee, name in new:
        print(f"{caller}/ (floor {FLOOR_OF[caller]}) calls {name}, defined only in {callee}/ "
              f"(floor {FLOOR_OF[callee]}): move the definition down, or the caller up")
    stale = sorted(k for k in KNOWN if not any(c[0] == k[0] and c[1] == k[1] and c[2].startswith(k[2])
                                                for c in calls))
    for caller, callee, prefix in stale:
        print(f"KNOWN lists {caller}/ -> {callee}/ {prefix}...), which no longer occurs: drop it from "
              f"tests/link_layering_check.py")
    known = len(calls) - len(new)
    if new or stale:
        print(f"link_layering_check: {len(new)} upward call(s), {len(stale)} stale KNOWN entr(ies).")
        return 1
    besides = f" (besides the {known} KNOWN upward call(s), each with its reason in this script)" if known else ""
    print(f"link_layering_check: {len(libs)} libraries, every call goes down a floor{besides}.")
    return 0


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        def lib(folder, source):
            os.makedirs(os.path.join(tmp, folder))
            c = os.path.join(tmp, folder, "x.c")
            with open(c, "w") as f:
                f.write(source)
            subprocess.run(["cc", "-c", c, "-o", c + ".o"], check=True)
            subprocess.run(["ar", "rcs", os.path.join(tmp, folder, f"libstrata_{folder}.a"), c + ".o"], check=True)
        lib("core", "void high(void); void low(void) { high(); }\n")
        lib("bench", "void low(void); void high(void) { }\nvoid deep(void) { low(); }\n")
        calls = upward_calls(libraries(tmp))
    expected = {("core", "bench", "high")}
    if calls != expected:
        print(f"self-test FAILED: expected {expected} (core calling bench), got {calls}")
        return 1
    print("link_layering_check --self-test: an upward call is caught, a downward one is not.")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print("usage: link_layering_check.py BUILD_DIR | --self-test", file=sys.stderr)
        return 2
    return check(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
