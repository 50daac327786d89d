// A Go sync.Mutex storm for the lock-storm corpus (tests/tests/corpus.rs): `-goroutines`
// goroutines take one sync.Mutex with a short critical section. What runs is the Go runtime's
// own locking: the mutex spins, then parks the goroutine (semacquire), and idle Ms sleep on
// futexes in the runtime until a released goroutine needs one. Run it with GOMAXPROCS above
// the CPUs the container may use, as a service sized from the node does.
//
// With -pool it runs a pool waiting for work instead (condPool). With -hold-ms N it runs a slow, regular contention instead, whose count it keeps itself (the
// ground truth of stormwatch's Go mutex figures, tests/tests/callsites.rs): one goroutine holds
// the mutex N ms and leaves it free N ms, in turn; `-goroutines` others take it and let it go
// every millisecond. Every Lock goes through lockCounting, which counts the calls that find
// the mutex held (a TryLock that fails): each such Lock enters the mutex's slow path.
//
// Prints {"ops":…,"seconds":…,"mutex_wait_seconds":…} every second while it runs, then one JSON line at the end:
// {"ops":…,"gomaxprocs":…,"cpu_seconds":…} (with -hold-ms, only the last line, with
// "contended":…, "seconds":…). With -own, each goroutine takes a mutex of its own: the storm's
// counterfactual, the same work with the lock made uncontended.
package main

import (
	"flag"
	"fmt"
	"runtime"
	"runtime/metrics"
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
		mu.Lock() // the storm's Lock
		x = burn(inside, x)
		sink += x
		mu.Unlock() // the storm's Unlock
		x = burn(outside, x)
		local++
		if local%1024 == 0 {
			progress.Add(1024)
		}
	}
	return local
}

// progress counts the operations done so far, in steps of 1024 per goroutine (the progress
// lines; the last line's "ops" is exact).
var progress atomic.Uint64

// contended counts the Lock calls that found the mutex held (-hold-ms).
var contended atomic.Uint64

// lockCounting takes mu, counting a call that finds it held: that Lock enters the slow path.
//
//go:noinline
func lockCounting(mu *sync.Mutex) {
	if mu.TryLock() {
		return
	}
	contended.Add(1)
	mu.Lock() // the contended Lock
}

// holder holds mu for hold, then leaves it free for hold, until stop.
//
//go:noinline
func holder(mu *sync.Mutex, stop *atomic.Bool, hold time.Duration) {
	for !stop.Load() {
		lockCounting(mu)
		time.Sleep(hold)
		mu.Unlock() // the holder hands on
		time.Sleep(hold)
	}
}

// taker takes mu and lets it go every millisecond, until stop.
//
//go:noinline
func taker(mu *sync.Mutex, stop *atomic.Bool, ops *atomic.Uint64) {
	for !stop.Load() {
		lockCounting(mu)
		mu.Unlock()
		ops.Add(1)
		time.Sleep(time.Millisecond)
	}
}

func holderPattern(takers, holdMs int, seconds float64) {
	var mu sync.Mutex
	var ops atomic.Uint64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	wg.Add(1 + takers)
	go func() {
		defer wg.Done()
		holder(&mu, &stop, time.Duration(holdMs)*time.Millisecond)
	}()
	for i := 0; i < takers; i++ {
		go func() {
			defer wg.Done()
			taker(&mu, &stop, &ops)
		}()
	}
	time.Sleep(time.Duration(seconds * float64(time.Second)))
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	fmt.Printf("{\"ops\":%d,\"gomaxprocs\":%d,\"contended\":%d,\"seconds\":%.3f}\n", ops.Load(), runtime.GOMAXPROCS(0), contended.Load(), elapsed)
}

// mutexWaitSeconds is the runtime's own count of the time goroutines waited for sync.Mutex and
// RWMutex (and, since Go 1.22, for the runtime's internal locks), as runtime/metrics exports
// it: the ground truth of stormwatch's reading of the same clock from outside.
func mutexWaitSeconds() float64 {
	s := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return -1
	}
	return s[0].Value.Float64()
}

// condPool runs `workers` goroutines that wait on a sync.Cond for tasks of `inside` iterations,
// queued under one mutex by a producer that spends `outside` iterations on each task: a pool
// waiting for work, its producer the limit (the Go shape of a condition-variable pool). Prints
// progress lines like the storm's, its work the tasks done.
func condPool(workers, inside, outside int, seconds float64) {
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	queue := 0
	var stop atomic.Bool
	var done atomic.Uint64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(x uint64) {
			defer wg.Done()
			for {
				mu.Lock()
				for queue == 0 && !stop.Load() {
					cond.Wait()
				}
				if stop.Load() {
					mu.Unlock()
					return
				}
				queue--
				mu.Unlock()
				x = burn(inside, x)
				sink += x
				done.Add(1)
			}
		}(uint64(w + 1))
	}
	go func() {
		x := uint64(7)
		for !stop.Load() {
			x = burn(outside, x)
			mu.Lock()
			// A bounded queue: the producer waits while the workers are behind.
			for queue >= 2*workers && !stop.Load() {
				mu.Unlock()
				runtime.Gosched()
				mu.Lock()
			}
			queue++
			mu.Unlock()
			cond.Signal()
		}
	}()
	start := time.Now()
	deadline := start.Add(time.Duration(seconds * float64(time.Second)))
	for now := time.Now(); now.Before(deadline); now = time.Now() {
		time.Sleep(min(time.Second, deadline.Sub(now)))
		fmt.Printf("{\"ops\":%d,\"seconds\":%.3f,\"mutex_wait_seconds\":%.6f}\n", done.Load(), time.Since(start).Seconds(), mutexWaitSeconds())
	}
	stop.Store(true)
	mu.Lock()
	cond.Broadcast()
	mu.Unlock()
	wg.Wait()
	fmt.Printf("{\"ops\":%d,\"gomaxprocs\":%d}\n", done.Load(), runtime.GOMAXPROCS(0))
}

func main() {
	goroutines := flag.Int("goroutines", 64, "goroutines contending on the mutex")
	seconds := flag.Float64("seconds", 10, "how long to run")
	inside := flag.Int("inside", 200, "work iterations while holding the mutex")
	outside := flag.Int("outside", 200, "work iterations between acquisitions")
	holdMs := flag.Int("hold-ms", 0, "run the slow holder pattern: hold the mutex this long, then leave it free as long")
	own := flag.Bool("own", false, "each goroutine takes a mutex of its own: the storm's counterfactual, the lock made uncontended")
	pool := flag.Bool("pool", false, "run a pool of -goroutines workers waiting on a sync.Cond for tasks of -inside iterations, fed by one producer spending -outside per task")
	flag.Parse()

	if *pool {
		condPool(*goroutines, *inside, *outside, *seconds)
		return
	}
	if *holdMs > 0 {
		holderPattern(*goroutines, *holdMs, *seconds)
		return
	}

	var mu sync.Mutex
	var ops atomic.Uint64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := 0; g < *goroutines; g++ {
		wg.Add(1)
		lock := &mu
		if *own {
			lock = new(sync.Mutex)
		}
		go func(x uint64) {
			defer wg.Done()
			ops.Add(worker(lock, &stop, x, *inside, *outside))
		}(uint64(g + 1))
	}
	// Progress, every second: the operations so far (each goroutine's, added as it goes).
	start := time.Now()
	deadline := start.Add(time.Duration(*seconds * float64(time.Second)))
	for now := time.Now(); now.Before(deadline); now = time.Now() {
		time.Sleep(min(time.Second, deadline.Sub(now)))
		fmt.Printf("{\"ops\":%d,\"seconds\":%.3f,\"mutex_wait_seconds\":%.6f}\n", progress.Load(), time.Since(start).Seconds(), mutexWaitSeconds())
	}
	stop.Store(true)
	wg.Wait()
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
	fmt.Printf("{\"ops\":%d,\"gomaxprocs\":%d,\"cpu_seconds\":%.3f}\n", ops.Load(), runtime.GOMAXPROCS(0), cpu)
}
