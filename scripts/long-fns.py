#!/usr/bin/env python3
"""List Rust functions longer than a limit (default 100 lines).

Usage: scripts/long-fns.py [--limit N] DIR...   (e.g. scripts/long-fns.py bookie proxy)

A function's length is counted from its `fn` line to its closing brace,
found by counting braces outside strings, chars and comments. Good enough
for this code base; not a Rust parser.
"""
import os
import re
import sys

FN_RE = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)')


def strip(line, state):
    """Remove strings, chars and comments from a line; state carries block comments / strings across lines."""
    out = []
    i = 0
    n = len(line)
    while i < n:
        if state['block']:
            j = line.find('*/', i)
            if j < 0:
                return ''.join(out)
            state['block'] = False
            i = j + 2
            continue
        if state['str']:
            if line[i] == '\\':
                i += 2
                continue
            if line[i] == '"':
                state['str'] = False
            i += 1
            continue
        if state['raw'] is not None:
            end = '"' + '#' * state['raw']
            j = line.find(end, i)
            if j < 0:
                return ''.join(out)
            state['raw'] = None
            i = j + len(end)
            continue
        c = line[i]
        if line.startswith('//', i):
            break
        if line.startswith('/*', i):
            state['block'] = True
            i += 2
            continue
        m = re.match(r'b?r(#*)"', line[i:])
        if m and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == '_')):
            state['raw'] = len(m.group(1))
            i += m.end()
            continue
        if c == '"':
            state['str'] = True
            i += 1
            continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", line[i:])
            if m:
                i += m.end()
                continue
        out.append(c)
        i += 1
    return ''.join(out)


def scan(path, limit):
    with open(path, encoding='utf-8') as f:
        lines = f.readlines()
    state = {'block': False, 'str': False, 'raw': None}
    clean = [strip(l, state) for l in lines]
    found = []
    for idx, l in enumerate(clean):
        m = FN_RE.match(l)
        if not m:
            continue
        depth = 0
        opened = False
        for j in range(idx, len(clean)):
            seg = clean[j]
            if not opened and ';' in seg and '{' not in seg:
                break  # declaration without body
            for ch in seg:
                if ch == '{':
                    depth += 1
                    opened = True
                elif ch == '}':
                    depth -= 1
            if opened and depth <= 0:
                length = j - idx + 1
                if length > limit:
                    found.append((length, path, idx + 1, m.group(7)))
                break
    return found


def main():
    args = sys.argv[1:]
    limit = 100
    if args[:1] == ['--limit']:
        limit = int(args[1])
        args = args[2:]
    found = []
    for root in args or ['.']:
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x not in ('target', 'vendor')]
            for name in files:
                if name.endswith('.rs'):
                    found += scan(os.path.join(d, name), limit)
    for length, path, line, name in sorted(found, key=lambda t: (t[1], t[2])):
        print(f'{length:5} {path}:{line} {name}')
    print(f'{len(found)} functions over {limit} lines', file=sys.stderr)


if __name__ == '__main__':
    main()
