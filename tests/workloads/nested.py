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


def outer_loop(secs):
    # Seconds of this process's CPU time, not of the wall clock: on a loaded machine it gets a
    # fraction of a CPU, and a test counting its samples needs the same work either way.
    items = list(range(2000))
    end = time.process_time() + secs
    while time.process_time() < end:
        middle_layer(items)


if __name__ == "__main__":
    outer_loop(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
