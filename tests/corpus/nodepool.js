// A Node.js service's libuv thread pool under crypto work, for the lock-storm corpus
// (tests/src/corpus.rs): the event loop keeps 2 tasks per pool thread in flight, each a
// pbkdf2-sha256 of ITERATIONS rounds run on the pool (libuv's own queue: a mutex and a
// condition variable), and starts the next as each one completes.
//
//   UV_THREADPOOL_SIZE=N node nodepool.js ITERATIONS SECONDS
//
// Prints {"ops":N,"seconds":S} every second: tasks completed so far, seconds since the start.
const crypto = require('crypto');
const iterations = +(process.argv[2] || 100);
const seconds = +(process.argv[3] || 10);
const inflight = 2 * (+process.env.UV_THREADPOOL_SIZE || 4);
let ops = 0, start = process.hrtime.bigint();
const el = () => Number(process.hrtime.bigint() - start) / 1e9;
function one() { crypto.pbkdf2('secret', 'salt', iterations, 32, 'sha256', () => { ops++; one(); }); }
for (let i = 0; i < inflight; i++) one();
const t = setInterval(() => {
  console.log(JSON.stringify({ops, seconds: +el().toFixed(3)}));
  if (el() >= seconds) { clearInterval(t); process.exit(0); }
}, 1000);
