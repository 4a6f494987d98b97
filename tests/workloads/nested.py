"""Nested Python functions, part of the time called back from C (sorted() with a key
function), so one stack holds several interpreter evaluations."""
import sys
import time


def weigh_item(x):
    total = 0
    for i in range(40):
        total += (x * i) % 7
    return total


def sort_through_c(items):
    return sorted(items, key=weigh_item)


def sum_squares(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def middle_layer(items):
    sum_squares(20000)
    return sort_through_c(items)


def outer_loop(secs):
    items = list(range(2000))
    end = time.monotonic() + secs
    while time.monotonic() < end:
        middle_layer(items)


if __name__ == "__main__":
    outer_loop(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
