#!/usr/bin/env python3
"""The layering check: every #include of a Strata header goes down a floor, never up or sideways.

The floors, bottom up, are those of docs/DESIGN.md ("Layers"); folders on one floor do not include
each other. Usage: layering_check.py REPO_ROOT     checks the tree, prints each bad include
                   layering_check.py --self-test  shows that each kind of bad include is caught
"""
import os
import re
import sys
import tempfile

FLOORS = [
    ["core"],
    ["offload", "optim"],
    ["config", "comm"],
    ["plan"],
    ["engine"],
    ["checkpoint"],
    ["models"],
    ["train"],
    ["sim"],
    ["bench"],
    ["cli"],
]
FLOOR_OF = {folder: i for i, floor in enumerate(FLOORS) for folder in floor}
SOURCE = re.compile(r"\.(h|cc|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/([^"]+)"')


def bad_includes(root):
    """Yields (file, line number, included path, why) for each include that is not downward."""
    for folder, floor in FLOOR_OF.items():
        base = os.path.join(root, folder)
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not SOURCE.search(name):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) == folder or m.group(1) not in FLOOR_OF:
                            continue
                        target = FLOOR_OF[m.group(1)]
                        if target > floor:
                            why = "up"
                        elif target == floor:
                            why = "sideways"
                        else:
                            if not os.path.exists(os.path.join(root, m.group(1), m.group(2))):
                                yield (os.path.relpath(path, root), number, m.group(1) + "/" + m.group(2),
                                       "a file that does not exist")
                            continue
                        yield (os.path.relpath(path, root), number, m.group(1) + "/" + m.group(2),
                               f"{why}: {folder}/ is on floor {floor}, {m.group(1)}/ on floor {target}")


def check(root):
    bad = list(bad_includes(root))
    for path, number, included, why in bad:
        print(f"{path}:{number}: includes \"{included}\" ({why}); move the code to the lower floor "
              "or turn the dependency around (docs/DESIGN.md, \"Layers\")")
    if not bad:
        print(f"layering: every include in {', '.join(sorted(FLOOR_OF))} goes down a floor")
    return 1 if bad else 0


def self_test():
    cases = {
        "up": ("engine/a.h", '#include "train/b.h"\n', "train/b.h"),
        "sideways": ("offload/a.h", '#include "optim/b.h"\n', "optim/b.h"),
        "missing": ("engine/a.cc", '#include "core/nothere.h"\n', None),
        "down": ("engine/a.cc", '#include "core/b.h"\n', "core/b.h"),
    }
    failures = 0
    for kind, (source, text, target) in cases.items():
        with tempfile.TemporaryDirectory() as root:
            for rel, body in ((source, text), (target, "")) if target else ((source, text),):
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w") as f:
                    f.write(body)
            found = list(bad_includes(root))
            expected = 0 if kind == "down" else 1
            if len(found) != expected:
                print(f"self-test '{kind}': expected {expected} bad include(s), found {found}")
                failures += 1
    print("layering self-test:", "failed" if failures else "each kind of bad include is caught")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        sys.exit(self_test())
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print("usage: layering_check.py REPO_ROOT | --self-test", file=sys.stderr)
        sys.exit(2)
    sys.exit(check(sys.argv[1]))
