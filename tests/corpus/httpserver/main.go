// A plain Go net/http server for `cargo xtask bench --ordinary`: the HTTP row of the
// ordinary-workloads table (what an agent costs a web service). It answers every request
// with a small fixed body.
package main

import (
	"flag"
	"log"
	"net/http"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8089", "address to serve on")
	flag.Parse()
	body := []byte("hello from the stormwatch benchmark\n")
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(body)
	})
	log.Printf("listening on %s", *listen)
	log.Fatal(http.ListenAndServe(*listen, nil))
}
