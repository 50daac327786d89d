// A Go sync.Mutex storm for the lock-storm corpus (tests/tests/corpus.rs): `-goroutines`
// goroutines take one sync.Mutex with a short critical section. What runs is the Go runtime's
// own locking: the mutex spins, then parks the goroutine (semacquire), and idle Ms sleep on
// futexes in the runtime until a released goroutine needs one. Run it with GOMAXPROCS above
// the CPUs the container may use, as a service sized from the node does.
//
// Prints one JSON line at the end: {"ops":…,"gomaxprocs":…,"cpu_seconds":…}.
package main

import (
	"flag"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var sink uint64

func burn(iterations int, x uint64) uint64 {
	x |= 1
	for i := 0; i < iterations; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

// worker takes mu around `inside` iterations of work until stop, and returns its operations. A
// named function (not inlined), so that the call sites stormwatch names are this file's
// (tests/tests/callsites.rs).
//
//go:noinline
func worker(mu *sync.Mutex, stop *atomic.Bool, x uint64, inside, outside int) uint64 {
	var local uint64
	for !stop.Load() {
		mu.Lock()
		x = burn(inside, x)
		sink += x
		mu.Unlock()
		x = burn(outside, x)
		local++
	}
	return local
}

func main() {
	goroutines := flag.Int("goroutines", 64, "goroutines contending on the mutex")
	seconds := flag.Float64("seconds", 10, "how long to run")
	inside := flag.Int("inside", 200, "work iterations while holding the mutex")
	outside := flag.Int("outside", 200, "work iterations between acquisitions")
	flag.Parse()

	var mu sync.Mutex
	var ops atomic.Uint64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := 0; g < *goroutines; g++ {
		wg.Add(1)
		go func(x uint64) {
			defer wg.Done()
			ops.Add(worker(&mu, &stop, x, *inside, *outside))
		}(uint64(g + 1))
	}
	time.Sleep(time.Duration(*seconds * float64(time.Second)))
	stop.Store(true)
	wg.Wait()
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
	fmt.Printf("{\"ops\":%d,\"gomaxprocs\":%d,\"cpu_seconds\":%.3f}\n", ops.Load(), runtime.GOMAXPROCS(0), cpu)
}
