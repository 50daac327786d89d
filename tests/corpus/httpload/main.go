// A keep-alive load generator for the lock-storm corpus (tests/src/corpus.rs): -clients
// goroutines each send requests back to back, on connections of their own kept alive, to
// -addr for -seconds. It runs outside the case's cgroup, as redis-benchmark does. -proto
// says what the server speaks: http (GET /), memcache (the text protocol: a set of the
// client's own key, then a get of it, in turn) or redis (RESP: SET, then GET, in turn). Each
// answer read is one request.
//
// Prints {"requests":N,"seconds":S} every second while it runs (requests answered so far,
// seconds since the start) and once more when it stops, at -seconds or on SIGTERM/SIGINT.
// Until the server answers its first request (it may still be starting), failed requests are
// retried after 10 ms and not counted; after that a failure ends the run with status 1.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8089", "the server's host:port")
	clients := flag.Int("clients", 32, "concurrent keep-alive clients")
	seconds := flag.Float64("seconds", 10, "how long to send requests")
	proto := flag.String("proto", "http", "what the server speaks: http, memcache or redis")
	flag.Parse()

	var newClient func(c int) func() error
	switch *proto {
	case "http":
		newClient = httpClient(*addr, *clients)
	case "memcache", "redis":
		newClient = func(c int) func() error { return kvClient(*proto, *addr, c) }
	default:
		fmt.Fprintf(os.Stderr, "httpload: unknown -proto %q\n", *proto)
		os.Exit(2)
	}

	var requests atomic.Uint64
	var answered, stop atomic.Bool
	failed := make(chan error, 1)
	for c := 0; c < *clients; c++ {
		request := newClient(c)
		go func() {
			for !stop.Load() {
				err := request()
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

// One GET of / a call, on connections the clients keep alive.
func httpClient(addr string, clients int) func(int) func() error {
	url := "http://" + addr + "/"
	transport := &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	return func(int) func() error {
		return func() error {
			resp, err := client.Get(url)
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %s", resp.Status)
			}
			return err
		}
	}
}

// One request a call on a connection of the client's own (dialled again after a failure): a
// set of the client's key, then a get of it, in turn.
func kvClient(proto, addr string, c int) func() error {
	key := fmt.Sprintf("stormwatch-load-%d", c)
	value := "0123456789abcdef"
	var conn net.Conn
	var r *bufio.Reader
	n := 0
	return func() error {
		if conn == nil {
			var err error
			if conn, err = net.DialTimeout("tcp", addr, 10*time.Second); err != nil {
				conn = nil
				return err
			}
			r = bufio.NewReader(conn)
		}
		n++
		set := n%2 == 1
		var req string
		switch {
		case proto == "memcache" && set:
			req = fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", key, len(value), value)
		case proto == "memcache":
			req = fmt.Sprintf("get %s\r\n", key)
		case set:
			req = fmt.Sprintf("*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(key), key, len(value), value)
		default:
			req = fmt.Sprintf("*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(key), key)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		err := write(conn, req)
		if err == nil {
			err = answer(proto, set, r)
		}
		if err != nil {
			conn.Close()
			conn = nil
		}
		return err
	}
}

func write(conn net.Conn, req string) error {
	_, err := io.WriteString(conn, req)
	return err
}

// Reads one answer: memcache's STORED, or VALUE…END (END alone for a miss); redis's +OK, or a
// bulk string ($-1 for a miss).
func answer(proto string, set bool, r *bufio.Reader) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	switch {
	case proto == "memcache" && set:
		if line != "STORED\r\n" {
			return fmt.Errorf("memcache set answered %q", line)
		}
	case proto == "memcache":
		for line != "END\r\n" {
			if !strings.HasPrefix(line, "VALUE ") {
				return fmt.Errorf("memcache get answered %q", line)
			}
			if _, err := r.ReadString('\n'); err != nil { // the data block
				return err
			}
			if line, err = r.ReadString('\n'); err != nil {
				return err
			}
		}
	case set:
		if line != "+OK\r\n" {
			return fmt.Errorf("redis SET answered %q", line)
		}
	default:
		if !strings.HasPrefix(line, "$") {
			return fmt.Errorf("redis GET answered %q", line)
		}
		if line != "$-1\r\n" {
			if _, err := r.ReadString('\n'); err != nil {
				return err
			}
		}
	}
	return nil
}
