#!/usr/bin/env python3
"""Sums host_sampler.so samples per function: report.py SAMPLES BINARY [--within SUBSTRING] [--top N].

BINARY is the unstripped build of the sampled program (the device runs a stripped copy of the same build:
offsets agree). Frames in other modules are named by module. --within keeps only samples with a frame whose
name contains SUBSTRING (e.g. the batched forward), so the shares are of that function's time."""
import argparse
import collections
import os
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("samples")
ap.add_argument("binary")
ap.add_argument("--within", default="")
ap.add_argument("--top", type=int, default=40)
ap.add_argument("--module", default="", help="the sampled program's file name (default: BINARY's)")
a = ap.parse_args()
exe = a.module or os.path.basename(a.binary)
rows = [line.split() for line in open(a.samples) if line.strip()]
addrs = sorted({int(f.rsplit("+", 1)[1], 16) - 1 for r in rows for f in r if f.rsplit("+", 1)[0] == exe})
names = {}
if addrs:
    out = subprocess.run(["addr2line", "-f", "-C", "-e", a.binary] + [hex(x) for x in addrs],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    names = {x: out[2 * i] for i, x in enumerate(addrs)}


def name(frame):
    mod, off = frame.rsplit("+", 1)
    if mod == exe:
        return names.get(int(off, 16) - 1, frame)
    return mod


total = len(rows)
stacks = []
for r in rows[:]:
    s = [name(f) for f in r[2:]]  # the handler and the signal trampoline come first
    if a.within and not any(a.within in n for n in s):
        continue
    stacks.append(s)
self_c, incl = collections.Counter(), collections.Counter()
for s in stacks:
    if s:
        self_c[s[0]] += 1
    for n in set(s):
        incl[n] += 1
n = max(1, len(stacks))
print(f"{len(stacks)} of {total} samples" + (f" within '{a.within}'" if a.within else ""))
print("\nself:")
for k, v in self_c.most_common(a.top):
    print(f"{100 * v / n:6.1f}%  {k[:160]}")
print("\ninclusive:")
for k, v in incl.most_common(a.top):
    print(f"{100 * v / n:6.1f}%  {k[:160]}")
