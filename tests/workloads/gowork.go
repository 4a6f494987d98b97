// A CPU-bound Go program for the unwinder: Go keeps frame pointers on amd64 but its call frame
// information is only in a (zlib-compressed) .debug_frame. The time goes into sort.Slice with a
// closure, and into a frameless leaf (mix, no frame: it never saves the frame pointer), whose
// caller a frame-pointer walk skips. It allocates nothing in the loop, so the garbage collector
// stays idle and almost every sample is on the main goroutine. Argument: seconds to run.
package main

import (
	"os"
	"sort"
	"strconv"
	"time"
)

// mix has no frame and calls nothing: the Go assembler leaves the frame pointer alone.
//
//go:noinline
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

//go:noinline
func scramble(v []uint64, seed uint64) {
	for i := range v {
		for k := 0; k < 8; k++ {
			seed = mix(seed + uint64(k))
		}
		v[i] = seed
	}
}

//go:noinline
func sortOnce(v []uint64) {
	sort.Slice(v, func(i, j int) bool { return mix(v[i]) < mix(v[j]) })
}

//go:noinline
func work(v []uint64, until time.Time) uint64 {
	seed := uint64(1)
	for time.Now().Before(until) {
		scramble(v, seed)
		sortOnce(v)
		seed = v[0]
	}
	return seed
}

func main() {
	secs := 4.0
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			secs = s
		}
	}
	v := make([]uint64, 20000)
	until := time.Now().Add(time.Duration(secs * float64(time.Second)))
	if work(v, until) == 42 {
		os.Exit(3)
	}
}
