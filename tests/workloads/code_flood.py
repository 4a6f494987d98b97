"""A Python program an unprivileged user could run to make the profiler's Python symbolizer
grow (issue 25): every call goes through code objects never seen before, 48 deep, each
carrying a line table of 63 KB. Runs until killed."""

import sys
import types

# One function whose body spans 7,000 lines (a line table just under the 64 KiB the daemon
# reads of one), then returns after calling the next function down the chain.
BODY = "def f(chain):\n    x = 0\n" + "".join(f"    x += {i}\n" for i in range(7_000))
BODY += "    if chain:\n        chain[0](chain[1:])\n    else:\n        spin()\n    return x\n"


def spin():
    n = 0
    for i in range(2_000):
        n += i
    return n


template = {}
exec(compile(BODY, "code_flood_template.py", "exec"), {"spin": spin}, template)
code = template["f"].__code__
sys.setrecursionlimit(10_000)
print(f"line table {len(code.co_linetable)} bytes", flush=True)

n = 0
while True:
    chain = []
    for _ in range(48):
        n += 1
        # A new code object each time (same bytecode and line table, another name): at a new
        # address, never in the symbolizer's cache.
        chain.append(types.FunctionType(code.replace(co_name=f"flood_{n}"), {"spin": spin}))
    chain[0](chain[1:])
