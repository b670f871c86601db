#!/usr/bin/env python3
"""The size rules of STYLE (docs/architecture.md, "Code layout"): no function
over 120 lines and no file over 900 lines in the daemons', the library's and
the tools' sources (agent/, client_lib/src, coordinator/, cli/, common/).

    scripts/check-sizes.py            # list what breaks a rule; exit 1 if any
    scripts/check-sizes.py --top 10   # also the 10 longest functions
    scripts/check-sizes.py --self-test  # the rules caught on made-up files

Run by ctest as SizeRules and SizeRulesSelfTest (label format, about a
second each), so CI's test command keeps the rules true.

A function is a brace block whose header (the text since the previous ';',
'{' or '}') has a parameter list and is not a namespace, class, struct,
enum or union; lambdas and local classes count within their function. The
length is from the header's first line to the closing brace. Comments and
string literals are skipped. A heuristic, not a parser: good enough for
kolo's clang-formatted code, where a function's header starts its line."""

import argparse
import os
import re
import subprocess
import sys

ROOTS = ["agent", "client_lib/src", "coordinator", "cli", "common"]
EXTS = (".cc", ".h", ".cpp", ".hpp", ".cu")
FUNC_MAX = 120
FILE_MAX = 900
NOT_FUNC = re.compile(r"\b(namespace|class|struct|enum|union)\b|extern\s+\"C\"|=\s*$")


def strip(text):
    """Comments and literals blanked, line breaks kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, lines) of each top-level function of a file."""
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    found = []
    stack = []  # per open brace: None (scope) or (name, start line) for a function
    header_start = 0
    line = 1
    in_func = 0
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c in ";{}":
            if c == "{":
                header = text[header_start:i]
                is_func = (in_func == 0 and "(" in header and not NOT_FUNC.search(header)
                           and not header.strip().startswith("#"))
                if is_func:
                    lead = len(header) - len(header.lstrip())
                    start = line - header.count("\n", lead)
                    m = re.search(r"([~\w:]+(?:operator\S*)?)\s*\([^()]*", header)
                    name = m.group(1) if m else "?"
                    stack.append((name, start))
                    in_func += 1
                else:
                    stack.append(None)
                    if in_func:
                        in_func += 1
            elif c == "}" and stack:
                top = stack.pop()
                if top is not None:
                    in_func -= 1
                    found.append((top[0], top[1], line - top[1] + 1))
                elif in_func:
                    in_func -= 1
            header_start = i + 1
    return found


def sources(root):
    files = subprocess.run(["git", "-C", root, "ls-files", "--"] + ROOTS, capture_output=True,
                           text=True, check=True).stdout.split()
    return [f for f in files if f.endswith(EXTS)]


def violations(path, rel):
    """What in one file breaks a rule, and its functions as (length, rel, start, name)."""
    bad, funcs = [], []
    n = sum(1 for _ in open(path, encoding="utf-8", errors="replace"))
    if n > FILE_MAX:
        bad.append(f"{rel}: {n} lines (files: at most {FILE_MAX})")
    for name, start, length in functions(path):
        funcs.append((length, rel, start, name))
        if length > FUNC_MAX:
            bad.append(f"{rel}:{start}: {name} is {length} lines (functions: at most {FUNC_MAX})")
    return bad, funcs


def self_test():
    """The checker against files made to sit just inside and just over the limits."""
    import tempfile

    def body(lines):
        return "".join(f"  x += {i};  // {{ not a brace\n" for i in range(lines - 2))

    cases = {
        # name: (text, the reports expected)
        "fits.cc": ("int fits(int x) {\n" + body(FUNC_MAX) + "}\n", 0),
        "long.cc": ("namespace k {\nint Op::run(int x) {\n" + body(FUNC_MAX + 1) + "}\n}\n", 1),
        "lambda.cc": ("void f() {\n  auto g = [&](int x) {\n" + body(FUNC_MAX) + "  };\n}\n", 1),
        "class.h": ("class A {\n" + "".join(f"  int m{i}() {{ return {i}; }}\n" for i in range(200)) + "};\n", 0),
        "big.cc": ("".join(f"int v{i} = {i};\n" for i in range(FILE_MAX + 1)), 1),
    }
    failed = 0
    with tempfile.TemporaryDirectory() as d:
        for name, (text, want) in cases.items():
            path = os.path.join(d, name)
            with open(path, "w") as f:
                f.write(text)
            bad, _ = violations(path, name)
            if len(bad) != want:
                failed += 1
                print(f"self-test: {name}: {len(bad)} reports, expected {want}: {bad}")
    print(f"check-sizes self-test: {len(cases) - failed} of {len(cases)} cases as expected", file=sys.stderr)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    bad = []
    all_funcs = []
    for rel in sources(args.root):
        path = os.path.join(args.root, rel)
        if not os.path.exists(path):
            continue
        b, f = violations(path, rel)
        bad += b
        all_funcs += f
    for b in bad:
        print(b)
    if args.top:
        print(f"the {args.top} longest functions:")
        for length, rel, start, name in sorted(all_funcs, reverse=True)[:args.top]:
            print(f"  {length:4d}  {rel}:{start}  {name}")
    print(f"check-sizes: {len(bad)} over the limits in {', '.join(ROOTS)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
