#!/usr/bin/env python3
"""The note check: every named note of the tree has exactly one head, and its references name files
that exist.

Strata explains a decision that spans files in a named note (STYLE.md habit 10, docs/DESIGN.md): the
note's text is written once, at its head, and every other place refers to it as
"see Note [Title] in path/to/file". A head is
  - in C++/CUDA sources, a comment line that starts with the note's name, followed by ':' or nothing:
        // Note [Title]: the text ...
  - in shell, Python, CMake and text files, the same with '#':   # Note [Title]: ...
  - in Markdown, a heading that starts with the note's name:    ### Note [Title]
Every other occurrence of the name is a mention. A mention followed by " in PATH", " (PATH" or
", PATH" names the file holding the head; PATH is relative to the repository root, so references
go stale visibly when files move.

Fails (exit 1), naming the note and the files, on:
  - a note mentioned but with no head;
  - a note with several heads;
  - a reference to a path that does not exist, or to a file that does not hold the note's head;
  - a mention outside the head's file that names no path (a reader must find the text from any mention).

Usage: notes_check.py [ROOT]        check the tree at ROOT (default: the repository holding this file)
       notes_check.py --fix-paths [ROOT]
                                    first rewrite each reference's path to the file holding the note's
                                    head (after files moved) and give each mention without one " in PATH",
                                    then check
       notes_check.py --self-test   run the checker on small fake trees, one per defect
Python 3 standard library only.
"""

import os
import re
import sys
import tempfile

# Spelled in two pieces so that this file holds no note name of its own.
NOTE_WORD = "Note" + " "
CODE_EXTS = (".h", ".cc", ".cu", ".cuh", ".cpp", ".hpp", ".c")
HASH_EXTS = (".sh", ".py", ".txt", ".cmake")
DOC_EXTS = (".md",)
SELF = "tests/notes_check.py"
PATH_EXTS = CODE_EXTS + HASH_EXTS + DOC_EXTS + (".json", ".toml")

NAME = re.compile(re.escape(NOTE_WORD) + r"\[([^\]\n]+)\]")
CODE_HEAD = re.compile(r"\s*//+\s*" + re.escape(NOTE_WORD) + r"\[([^\]\n]+)\](:|\s*$)")
HASH_HEAD = re.compile(r"\s*#+\s*" + re.escape(NOTE_WORD) + r"\[([^\]\n]+)\](:|\s*$)")
DOC_HEAD = re.compile(r"#{1,6}\s+" + re.escape(NOTE_WORD) + r"\[([^\]\n]+)\]")
# What may follow a name to say where its head is: " in PATH", " (PATH", ", PATH".
WHERE = re.compile(r"\)?(?P<how> in |\s*\(|, )`?(?P<path>[A-Za-z0-9_.][A-Za-z0-9_./+-]*)")


def skipped_dir(name):
    return name.startswith("build") or name in (".venv", ".git", "node_modules", "__pycache__")


def scanned_files(root):
    """The files whose lines are read: sources, scripts and docs outside build folders, except this
    checker (whose documentation shows the forms it looks for)."""
    this_file = os.path.realpath(__file__)
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not skipped_dir(d))
        for name in sorted(files):
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if rel == SELF or os.path.realpath(path) == this_file:
                continue
            if name.endswith(CODE_EXTS + HASH_EXTS + DOC_EXTS):
                yield rel, path


def head_pattern(rel):
    if rel.endswith(CODE_EXTS):
        return CODE_HEAD
    if rel.endswith(DOC_EXTS):
        return DOC_HEAD
    return HASH_HEAD


def referenced_path(line, end):
    """(path, column) of the path a mention ending at `end` names, or None when it names none."""
    m = WHERE.match(line, end)
    if not m:
        return None
    path = m.group("path").rstrip(".,;:)`'\"")
    in_form = m.group("how") == " in "
    looks_like_file = path.endswith(PATH_EXTS)
    if "/" in path and (looks_like_file or path.endswith("/")):
        return path, m.start("path")
    if in_form and looks_like_file:
        return path, m.start("path")  # a bare file name: not relative to the root, reported as missing
    return None


def scan(root):
    """(heads, mentions): title -> [(file, line)], title -> [(file, line, path or None, column)];
    the column is the path's, or where the name ends when the mention names no path."""
    heads, mentions = {}, {}
    for rel, path in scanned_files(root):
        pattern = head_pattern(rel)
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        for number, line in enumerate(lines, 1):
            head = pattern.match(line)
            for m in NAME.finditer(line):
                title = m.group(1)
                if head and head.start(1) == m.start(1):
                    heads.setdefault(title, []).append((rel, number))
                    continue
                found = referenced_path(line, m.end())
                where, column, at = (*found, number) if found else (None, m.end(), number)
                if not found and number < len(lines) and line[m.end():].rstrip() in (" in", " (", ","):
                    # "Note [X] in" at the end of a line, the path opening the next (a wrapped comment)
                    nxt = lines[number]
                    lead = len(nxt) - len(nxt.lstrip(" \t/#*>"))
                    wrapped = referenced_path(" in " + nxt[lead:], 0)
                    if wrapped:
                        where, column, at = wrapped[0], lead + wrapped[1] - 4, number + 1
                mentions.setdefault(title, []).append((rel, at, where, column))
    return heads, mentions


def places(items, limit=6):
    text = ", ".join(f"{f}:{n}" for f, n, *_ in items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")


def check(root):
    """The list of problems found in the tree at root (empty: the tree passes)."""
    heads, mentions = scan(root)
    problems = []
    for title in sorted(set(heads) | set(mentions)):
        own = heads.get(title, [])
        if not own:
            problems.append(f"{NOTE_WORD}[{title}] has no head; mentioned at {places(mentions[title])}. "
                            f"Write its text once as a comment line '// {NOTE_WORD}[{title}]: ...' "
                            f"('#' in scripts, a heading in Markdown), or drop the mentions.")
        elif len(own) > 1:
            problems.append(f"{NOTE_WORD}[{title}] has {len(own)} heads: {places(own)}. Keep one (the "
                            f"full text), and make the others read 'see {NOTE_WORD}[{title}] in "
                            f"{own[0][0]}'.")
        for rel, number, where, _ in mentions.get(title, []):
            if where is None:
                if len(own) == 1 and own[0][0] != rel:
                    problems.append(f"{rel}:{number}: {NOTE_WORD}[{title}] names no path; write 'see "
                                    f"{NOTE_WORD}[{title}] in {own[0][0]}' (notes_check.py --fix-paths "
                                    f"does it).")
                continue
            if not os.path.isfile(os.path.join(root, where)):
                problems.append(f"{rel}:{number}: {NOTE_WORD}[{title}] in {where}: no such file (paths "
                                f"are relative to the repository root)"
                                + (f"; its head is in {own[0][0]}" if len(own) == 1 else "") + ".")
            elif len(own) == 1 and own[0][0] != where:
                problems.append(f"{rel}:{number}: {NOTE_WORD}[{title}] in {where}: that file does not "
                                f"hold the note; its head is in {own[0][0]}.")
    return problems, len(set(heads) | set(mentions)), sum(len(v) for v in mentions.values())


def fix_paths(root):
    """Rewrites every reference whose path is missing or wrong to the path of the note's head (after
    files moved), and gives each mention outside the head's file that names no path " in PATH";
    notes with no head or several are left for a person. Returns the count."""
    heads, mentions = scan(root)
    edits = {}
    for title, items in mentions.items():
        own = heads.get(title, [])
        if len(own) != 1:
            continue
        head_file = own[0][0]
        for rel, number, where, column in items:
            if where is not None and head_file != where:
                edits.setdefault(rel, []).append((number, column, where, head_file))
            elif where is None and rel != head_file:
                edits.setdefault(rel, []).append((number, column, None, head_file))
    for rel, items in edits.items():
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        # Right to left within a line, so earlier columns stay valid.
        for number, column, old, new in sorted(items, reverse=True, key=lambda e: (e[0], e[1])):
            line = lines[number - 1]
            if old is None:  # a mention with no path: " in PATH" after its name
                lines[number - 1] = line[:column] + f" in {new}" + line[column:]
                print(f"{rel}:{number}: + in {new}")
            else:
                lines[number - 1] = line[:column] + new + line[column + len(old):]
                print(f"{rel}:{number}: {old} -> {new}")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    return sum(len(v) for v in edits.values())


def main_check(root):
    problems, notes, mention_count = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"notes_check: {len(problems)} problem(s) in {root} ({notes} notes).")
        return 1
    print(f"notes_check: {notes} notes, {mention_count} mentions: one head each, every path exists.")
    return 0


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def self_test():
    """Each defect in a fake tree must fail, naming the note and the files; the clean tree passes."""
    n = NOTE_WORD
    clean = {
        "lib/a.h": f"// {n}[Alpha]: the text of Alpha.\nint a;\n",
        "lib/b.cc": f"// Uses it (see {n}[Alpha] in lib/a.h).\n",
        "scripts/run.sh": f"# {n}[Beta]\n# its text.\necho $(cat x) # see {n}[Alpha] in `lib/a.h`\n",
        "docs/D.md": f"### {n}[Gamma]\nText; see {n}[Beta] in scripts/run.sh and {n}[Alpha] (lib/a.h).\n",
        "build/x.h": f"// {n}[Alpha]: a build folder's copy does not count.\n",
    }
    defects = {
        "no head": ({"lib/c.cc": f"// see {n}[Delta] in lib/a.h\n"}, ["[Delta]", "no head", "lib/c.cc:1"]),
        "two heads": ({"lib/c.cc": f"// {n}[Alpha]: again.\n"}, ["[Alpha]", "2 heads", "lib/a.h:1", "lib/c.cc:1"]),
        "two heads in one file": ({"lib/a.h": f"// {n}[Alpha]: one.\n// {n}[Alpha]\n"},
                                  ["[Alpha]", "2 heads", "lib/a.h:1", "lib/a.h:2"]),
        "missing file": ({"lib/c.cc": f"// see {n}[Alpha] in old/a.h.\n"}, ["[Alpha]", "old/a.h", "no such file", "lib/c.cc:1"]),
        "bare file name": ({"lib/c.cc": f"// see {n}[Alpha] in a.h\n"}, ["[Alpha]", "a.h", "no such file"]),
        "wrong file": ({"lib/c.cc": f"// see {n}[Alpha] in lib/b.cc\n"}, ["[Alpha]", "lib/b.cc", "does not hold", "lib/a.h"]),
        "wrong file in markdown": ({"docs/E.md": f"See {n}[Gamma] (`lib/b.cc`).\n"}, ["[Gamma]", "lib/b.cc", "docs/D.md"]),
        "wrapped, wrong file": ({"lib/c.cc": f"// see {n}[Alpha] in\n// lib/b.cc for it.\n"},
                                ["[Alpha]", "lib/b.cc", "does not hold"]),
        "no path": ({"lib/c.cc": f"// as {n}[Alpha] says.\n"}, ["[Alpha]", "names no path", "lib/c.cc:1", "lib/a.h"]),
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        write_tree(tmp, clean)
        problems, notes, _ = check(tmp)
        if problems or notes != 3:
            failures.append(f"the clean tree: expected 3 notes and no problem, got {notes}: {problems}")
    for name, (extra, expected) in defects.items():
        with tempfile.TemporaryDirectory() as tmp:
            write_tree(tmp, clean)
            write_tree(tmp, extra)
            problems, _, _ = check(tmp)
            text = "\n".join(problems)
            missing = [e for e in expected if e not in text]
            if not problems or missing:
                failures.append(f"defect '{name}': expected a problem naming {missing or expected}, got: {problems}")
    with tempfile.TemporaryDirectory() as tmp:  # a head moved to another folder: --fix-paths follows it
        write_tree(tmp, {k: v for k, v in clean.items() if k != "lib/a.h"})
        write_tree(tmp, {"core/a.h": clean["lib/a.h"]})
        before = len(check(tmp)[0])
        fixed = fix_paths(tmp)
        after = check(tmp)[0]
        if before != 3 or fixed != 3 or after:
            failures.append(f"--fix-paths: expected 3 stale references fixed, got {before} problems, "
                            f"{fixed} fixed, then {after}")
    with tempfile.TemporaryDirectory() as tmp:  # a path on the next line counts
        write_tree(tmp, clean)
        write_tree(tmp, {"lib/c.cc": f"// see {n}[Alpha] in\n//   lib/a.h, wrapped.\n"})
        if check(tmp)[0]:
            failures.append(f"a path on the line after 'in': expected no problem, got {check(tmp)[0]}")
    with tempfile.TemporaryDirectory() as tmp:  # mentions with no path: --fix-paths gives them one
        write_tree(tmp, clean)
        write_tree(tmp, {"lib/c.cc": f"// {n}[Alpha] and ({n}[Beta]) and {n}[Alpha].\n"})
        fixed = fix_paths(tmp)
        after = check(tmp)[0]
        with open(os.path.join(tmp, "lib/c.cc"), encoding="utf-8") as f:
            text = f.read()
        want = (f"// {n}[Alpha] in lib/a.h and ({n}[Beta] in scripts/run.sh) and "
                f"{n}[Alpha] in lib/a.h.\n")
        if fixed != 3 or after or text != want:
            failures.append(f"--fix-paths without paths: expected 3 paths added giving {want!r}, got {fixed} "
                            f"fixed, {text!r}, then {after}")
    for f in failures:
        print("self-test FAILED:", f)
    cases = 4 + len(defects)
    print(f"notes_check --self-test: {cases - len(failures)} of {cases} cases pass.")
    return 1 if failures else 0


def main(argv):
    args = argv[1:]
    if args == ["--self-test"]:
        return self_test()
    fix = args[:1] == ["--fix-paths"]
    args = args[1:] if fix else args
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: notes_check.py [--fix-paths] [ROOT] | --self-test", file=sys.stderr)
        return 2
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(root):
        print(f"notes_check: {root}: not a directory; give the repository root.", file=sys.stderr)
        return 2
    if fix:
        print(f"notes_check: {fix_paths(root)} reference(s) rewritten to their note's head.")
    return main_check(root)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
