"""A Python program with the stack cardinality of a training node's input pipeline: 2,000
functions of a few lines each, called in random chains 20 to 40 deep, the leaf doing a little
arithmetic on one of several lines. Almost every sample is a stack not seen before, as on the
GPU node (a 75 s window held more than 20,000 distinct stacks). Runs for argv[1] seconds."""

import random
import sys
import time

FUNCTIONS = 2_000
SRC = []
for i in range(FUNCTIONS):
    SRC.append(
        f"def f{i}(chain, work):\n"
        f"    if chain:\n"
        f"        return chain[0](chain[1:], work)\n"
        f"    x = 0\n"
        f"    for k in range(work):\n"
        f"        x += k * {i}\n"
        f"        x ^= k\n"
        f"    return x\n"
    )
space = {}
exec(compile("\n".join(SRC), "py_chains_generated.py", "exec"), space)
funcs = [space[f"f{i}"] for i in range(FUNCTIONS)]

end = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
while time.monotonic() < end:
    chain = [rng.choice(funcs) for _ in range(rng.randint(20, 40))]
    chain[0](chain[1:], 200)
