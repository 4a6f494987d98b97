"""Nested Python functions, part of the time called back from C: sorted() with a key
function, and libc's qsort through ctypes (a C extension module and libffi) with a Python
comparison, so one stack holds several interpreter evaluations with native code between."""
import ctypes
import sys
import time

LIBC = ctypes.CDLL(None)
COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))


def weigh_item(x):
    total = 0
    for i in range(40):
        total += (x * i) % 7
    return total


def sort_through_c(items):
    return sorted(items, key=weigh_item)


def compare_in_python(a, b):
    x, y = weigh_item(a[0]), weigh_item(b[0])
    return (x > y) - (x < y)


CALLBACK = COMPARE(compare_in_python)


def sort_through_libc(items):
    array = (ctypes.c_int * len(items))(*items)
    LIBC.qsort(array, len(items), ctypes.sizeof(ctypes.c_int), CALLBACK)
    return array


def sum_squares(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def middle_layer(items):
    sum_squares(20000)
    sort_through_libc(items[:300])
    return sort_through_c(items)


def outer_loop(secs, settle):
    # Seconds of this process's CPU time, not of the wall clock: on a loaded machine it gets a
    # fraction of a CPU, and a test counting its samples needs the same work either way. After
    # `settle` of them it says "measuring": a test counts the samples from then on, when the
    # profiler has long described the new process (its first samples, before that, are
    # walked with frame pointers alone).
    items = list(range(2000))
    start = time.process_time()
    said = settle <= 0
    if said:
        print("measuring", flush=True)
    while time.process_time() < start + settle + secs:
        middle_layer(items)
        if not said and time.process_time() >= start + settle:
            print("measuring", flush=True)
            said = True


if __name__ == "__main__":
    outer_loop(
        float(sys.argv[1]) if len(sys.argv) > 1 else 5.0,
        float(sys.argv[2]) if len(sys.argv) > 2 else 0.0,
    )
