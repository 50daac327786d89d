//! `tokio_http <host:port> <worker threads> <iterations>`: the corpus's tokio service. A
//! multi-threaded tokio runtime of that many workers accepts keep-alive HTTP/1.1 connections
//! and answers every `GET` with `ok`, after a fixed piece of CPU work done on the runtime's
//! worker (no lock in the handler: what the runtime's scheduler does between its workers is
//! all there is). Loaded from outside its cgroup by tests/corpus/httpload; its work is the
//! requests answered. Runs until it is killed.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../workload_common.rs"]
mod common;

const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Type: text/plain\r\n\r\nok\n";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, workers, iterations] = args.as_slice() else {
        eprintln!("usage: tokio_http <host:port> <worker threads> <iterations>");
        std::process::exit(2);
    };
    let workers: usize = workers.parse().expect("worker threads: a number");
    let iterations: u32 = iterations.parse().expect("iterations: a number");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_io()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen.as_str())
            .await
            .unwrap_or_else(|e| panic!("binding {listen}: {e}"));
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(serve(socket, iterations));
        }
    });
}

/// Answers the connection's requests in turn until the client closes it.
async fn serve(mut socket: tokio::net::TcpStream, iterations: u32) {
    let _ = socket.set_nodelay(true);
    let mut buf = vec![0u8; 4096];
    let mut filled = 0;
    let mut sink = 0u64;
    loop {
        // A request ends at its blank line (a GET has no body).
        while let Some(end) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") {
            sink = common::burn(iterations, sink);
            std::hint::black_box(sink);
            if socket.write_all(RESPONSE).await.is_err() {
                return;
            }
            buf.copy_within(end + 4..filled, 0);
            filled -= end + 4;
        }
        if filled == buf.len() {
            return;
        }
        match socket.read(&mut buf[filled..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => filled += n,
        }
    }
}
