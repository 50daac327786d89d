// A keep-alive HTTP load generator for the lock-storm corpus (tests/src/corpus.rs): -clients
// goroutines each send GET requests back to back, on connections of their own kept alive,
// to -addr for -seconds. It runs outside the case's cgroup, as redis-benchmark does.
//
// Prints {"requests":N,"seconds":S} every second while it runs (requests answered so far,
// seconds since the start) and once more when it stops, at -seconds or on SIGTERM/SIGINT.
// Until the server answers its first request (it may still be starting), failed requests are
// retried after 10 ms and not counted; after that a failure ends the run with status 1.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8089", "the server's host:port")
	clients := flag.Int("clients", 32, "concurrent keep-alive clients")
	seconds := flag.Float64("seconds", 10, "how long to send requests")
	flag.Parse()

	url := "http://" + *addr + "/"
	transport := &http.Transport{MaxIdleConnsPerHost: *clients, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	var requests atomic.Uint64
	var answered, stop atomic.Bool
	failed := make(chan error, 1)
	for c := 0; c < *clients; c++ {
		go func() {
			for !stop.Load() {
				resp, err := client.Get(url)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %s", resp.Status)
					}
				}
				switch {
				case err == nil:
					answered.Store(true)
					requests.Add(1)
				case !answered.Load():
					time.Sleep(10 * time.Millisecond)
				default:
					select {
					case failed <- err:
					default:
					}
					return
				}
			}
		}()
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	start := time.Now()
	deadline := time.After(time.Duration(*seconds * float64(time.Second)))
	tick := time.NewTicker(time.Second)
	report := func() {
		fmt.Printf("{\"requests\":%d,\"seconds\":%.3f}\n", requests.Load(), time.Since(start).Seconds())
	}
	status := 0
loop:
	for {
		select {
		case <-tick.C:
			report()
		case <-deadline:
			break loop
		case <-signals:
			break loop
		case err := <-failed:
			fmt.Fprintf(os.Stderr, "httpload: %v\n", err)
			status = 1
			break loop
		}
	}
	report()
	stop.Store(true)
	os.Exit(status)
}
