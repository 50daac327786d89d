//! Who gets one of the endpoint's connection slots when they are all taken.
//!
//! Refusing the newest connection when `max_connections` are open lets whoever opened the
//! others first keep them: one client that holds its connections idle and reopens any that is
//! cut locks every scraper and the kubelet's probes out. So a new connection is always taken,
//! and the one that goes is a connection with nothing to lose — no request in flight, and no
//! response still moving — from the client that holds the most slots, the one that has waited
//! longest first ([`Table::decide`]):
//!
//! - one client (source address) may hold at most [`client_share`] of the slots; a new
//!   connection beyond its share replaces the client's own oldest idle one, so a client can
//!   only ever push out itself, never another address's scraper;
//! - when every slot is taken, the idle connection of the client with the most slots goes;
//! - when no connection can go (every one has a request in flight, or the client's own do),
//!   the new connection gets one of [`PROBE_SLOTS`] extra slots that serve only `/healthz` and
//!   `/readyz`, one request each, within [`PROBE_DEADLINE`]: the kubelet's probes still get an
//!   answer when its address is the same as that of the client holding the slots (a
//!   hostNetwork pod), and no client can hold those slots, which carry no response that takes
//!   time to send;
//! - only when the probe slots are busy too is a new connection refused.
//!
//! Every connection closed this way is counted ([`Shed`], `stormwatch_http_connections_dropped_total`)
//! and logged at most once a minute, with the true count since the previous line.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{sync::Notify, task::AbortHandle};

/// Slots beyond `max_connections` that serve only `/healthz` and `/readyz`.
pub const PROBE_SLOTS: usize = 2;
/// How long a connection on a probe slot has for its TLS handshake and its request's head.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);
/// A connection between requests counts as idle once its last response's bytes stopped
/// moving this long ago: until then the client is still reading it.
pub const STALL: Duration = Duration::from_secs(2);

/// The most slots one client address may hold: half of them (at least one).
pub fn client_share(max_connections: usize) -> usize {
    max_connections.div_ceil(2).max(1)
}

/// When a connection last moved a byte, and whether a request is in flight on it.
pub struct Activity {
    start: Instant,
    /// Milliseconds from `start` of the last byte read or written.
    last_ms: AtomicU64,
    /// Milliseconds from `start` of the last byte written; `u64::MAX` before the first.
    last_write_ms: AtomicU64,
    /// From a request's head to the end of its response's body.
    busy: AtomicBool,
}

impl Activity {
    pub fn new() -> Self {
        Self::since(Instant::now())
    }

    fn since(start: Instant) -> Self {
        Self {
            start,
            last_ms: AtomicU64::new(0),
            last_write_ms: AtomicU64::new(u64::MAX),
            busy: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start
            .elapsed()
            .as_millis()
            .min(u128::from(u64::MAX - 1)) as u64
    }

    pub fn read(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    pub fn wrote(&self) {
        let ms = self.now_ms();
        self.last_ms.store(ms, Ordering::Relaxed);
        self.last_write_ms.store(ms, Ordering::Relaxed);
    }

    pub fn set_busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::Relaxed);
    }

    /// When the connection last moved a byte either way (its opening if none).
    pub fn last_byte(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Completes once nothing has moved for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let deadline = self.last_byte() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    }

    /// Since when the connection could be closed without losing anything (`None`: not now).
    /// One that never answered has been waiting since it opened; one between requests since
    /// its last response stopped moving, [`STALL`] ago at least.
    fn idle_since(&self, now: Instant) -> Option<Instant> {
        if self.busy.load(Ordering::Relaxed) {
            return None;
        }
        match self.last_write_ms.load(Ordering::Relaxed) {
            u64::MAX => Some(self.start),
            ms => {
                let wrote = self.start + Duration::from_millis(ms);
                (now.saturating_duration_since(wrote) >= STALL).then_some(wrote)
            }
        }
    }
}

/// Marks a request in flight until dropped (with its response's body, once sent).
pub struct InFlight(Arc<Activity>);

impl InFlight {
    pub fn start(activity: &Arc<Activity>) -> Self {
        activity.set_busy(true);
        Self(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.set_busy(false);
    }
}

/// Which slots a connection holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Any request, up to `max_connections` of them.
    Main,
    /// `/healthz` and `/readyz` only, one request.
    Probe,
}

/// What to do with a new connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Take it on `lane`, closing `evict` first when set.
    Admit { lane: Lane, evict: Option<u64> },
    /// Close it: every slot has a request in flight.
    Refuse,
}

struct Entry {
    client: IpAddr,
    lane: Lane,
    activity: Arc<Activity>,
    abort: Option<AbortHandle>,
}

/// The open connections, by id.
pub struct Table {
    max_connections: usize,
    share: usize,
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// Main-lane connections per client.
    per_client: HashMap<IpAddr, usize>,
    probes: usize,
}

impl Table {
    pub fn new(max_connections: usize) -> Self {
        Self {
            max_connections,
            share: client_share(max_connections),
            next_id: 0,
            entries: HashMap::new(),
            per_client: HashMap::new(),
            probes: 0,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn held_by(&self, client: &IpAddr) -> usize {
        self.per_client.get(client).copied().unwrap_or(0)
    }

    /// Where a new connection from `client` goes, and which connection it replaces.
    pub fn decide(&self, client: IpAddr, now: Instant) -> Decision {
        let mains = self.entries.len() - self.probes;
        // The idle main-lane connection to close: of the client with the most slots (among
        // those `eligible`), the one idle the longest.
        let victim = |eligible: &dyn Fn(&Entry) -> bool| {
            self.entries
                .iter()
                .filter(|(_, e)| e.lane == Lane::Main && eligible(e))
                .filter_map(|(id, e)| Some((*id, e, e.activity.idle_since(now)?)))
                .max_by_key(|(id, e, since)| {
                    (
                        self.held_by(&e.client),
                        std::cmp::Reverse(*since),
                        std::cmp::Reverse(*id),
                    )
                })
                .map(|(id, _, _)| id)
        };
        let main = if self.held_by(&client) >= self.share {
            victim(&|e| e.client == client).map(Some)
        } else if mains >= self.max_connections {
            victim(&|_| true).map(Some)
        } else {
            Some(None)
        };
        if let Some(evict) = main {
            return Decision::Admit {
                lane: Lane::Main,
                evict,
            };
        }
        if self.probes < PROBE_SLOTS {
            return Decision::Admit {
                lane: Lane::Probe,
                evict: None,
            };
        }
        let oldest_probe = self
            .entries
            .iter()
            .filter(|(_, e)| e.lane == Lane::Probe)
            .filter_map(|(id, e)| Some((*id, e.activity.idle_since(now)?)))
            .min_by_key(|(id, since)| (*since, *id))
            .map(|(id, _)| id);
        match oldest_probe {
            Some(id) => Decision::Admit {
                lane: Lane::Probe,
                evict: Some(id),
            },
            None => Decision::Refuse,
        }
    }

    /// Records a connection; its task's abort handle follows with [`Table::set_abort`].
    pub fn insert(&mut self, client: IpAddr, lane: Lane, activity: Arc<Activity>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        match lane {
            Lane::Main => *self.per_client.entry(client).or_insert(0) += 1,
            Lane::Probe => self.probes += 1,
        }
        self.entries.insert(
            id,
            Entry {
                client,
                lane,
                activity,
                abort: None,
            },
        );
        id
    }

    pub fn set_abort(&mut self, id: u64, abort: AbortHandle) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.abort = Some(abort);
        }
    }

    /// Forgets a connection (it ended, or is being closed); whether it was there.
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(e) = self.entries.remove(&id) else {
            return false;
        };
        match e.lane {
            Lane::Main => {
                if let Some(n) = self.per_client.get_mut(&e.client) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_client.remove(&e.client);
                    }
                }
            }
            Lane::Probe => self.probes -= 1,
        }
        true
    }

    /// Closes a connection to make room: forgets it and cancels its task (which closes the
    /// socket as it is dropped).
    pub fn evict(&mut self, id: u64) {
        if let Some(abort) = self.entries.get_mut(&id).and_then(|e| e.abort.take()) {
            abort.abort();
        }
        self.remove(id);
    }
}

/// Connections closed to keep within the cap, by reason, since the server started.
#[derive(Debug, Default)]
pub struct Shed {
    /// Idle connections closed to make room for a new one.
    pub evicted: AtomicU64,
    /// New connections closed at once: every slot, the probe slots too, had a request in
    /// flight.
    pub refused: AtomicU64,
    /// Requests for another path than `/healthz` or `/readyz` on a probe slot (answered 503).
    pub probe_only: AtomicU64,
    changed: Notify,
}

/// The reasons, as `stormwatch_http_connections_dropped_total`'s `reason` label says them.
pub const REASONS: [&str; 3] = ["evicted", "refused", "probe_only"];

impl Shed {
    pub fn count(&self, reason: &AtomicU64) {
        reason.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_one();
    }

    /// The counts, in the order of [`REASONS`].
    pub fn totals(&self) -> [u64; 3] {
        [
            self.evicted.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.probe_only.load(Ordering::Relaxed),
        ]
    }
}

/// How often at most the shedding is logged.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// One log line: what happened since the previous line (`since`, or since the start), and the
/// totals.
pub fn shed_line(
    delta: [u64; 3],
    totals: [u64; 3],
    since: Option<Duration>,
    max_connections: usize,
) -> String {
    let when = match since {
        Some(d) => format!("in the last {} s", d.as_secs()),
        None => "since start".to_owned(),
    };
    format!(
        "HTTP server: {when}, {} idle connection(s) closed for new ones, {} connection(s) \
         refused (every slot busy), {} request(s) other than /healthz and /readyz on the probe \
         slots answered 503 (max_connections {max_connections}, {} per client address); since \
         start: {} closed, {} refused, {} answered 503",
        delta[0],
        delta[1],
        delta[2],
        client_share(max_connections),
        totals[0],
        totals[1],
        totals[2],
    )
}

/// Logs the shedding through `emit`: a line as soon as a connection is shed, then at most one
/// every [`LOG_EVERY`], each with the true count since the previous one; what is left when
/// `closing` changes goes out then. Returns after that last line.
pub async fn log_shedding(
    shed: Arc<Shed>,
    max_connections: usize,
    mut closing: tokio::sync::watch::Receiver<bool>,
    mut emit: impl FnMut(String),
) {
    let mut reported = [0_u64; 3];
    let mut last: Option<tokio::time::Instant> = None;
    let mut open = true;
    while open {
        tokio::select! {
            () = shed.changed.notified() => {}
            _ = closing.changed() => open = false,
        }
        if open && let Some(t) = last {
            tokio::select! {
                () = tokio::time::sleep_until(t + LOG_EVERY) => {}
                _ = closing.changed() => open = false,
            }
        }
        let totals = shed.totals();
        if totals == reported {
            continue;
        }
        let delta = [0, 1, 2].map(|i| totals[i] - reported[i]);
        emit(shed_line(
            delta,
            totals,
            last.map(|t| t.elapsed()),
            max_connections,
        ));
        reported = totals;
        last = Some(tokio::time::Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// A connection opened `age` before `now`, that wrote last `wrote` before `now`, busy or not.
    fn conn(now: Instant, age: u64, wrote: Option<u64>, busy: bool) -> Arc<Activity> {
        let a = Activity::since(now - Duration::from_millis(age));
        if let Some(w) = wrote {
            a.last_write_ms.store(age - w, Ordering::Relaxed);
        }
        a.set_busy(busy);
        Arc::new(a)
    }

    fn admit(lane: Lane, evict: Option<u64>) -> Decision {
        Decision::Admit { lane, evict }
    }

    #[test]
    fn room_is_taken_without_closing_anything() {
        let now = Instant::now();
        let mut t = Table::new(4);
        assert_eq!(t.decide(ip(1), now), admit(Lane::Main, None));
        t.insert(ip(1), Lane::Main, conn(now, 10, None, false));
        assert_eq!(t.decide(ip(2), now), admit(Lane::Main, None));
    }

    #[test]
    fn a_client_beyond_its_share_replaces_its_own_oldest_idle_connection() {
        let now = Instant::now();
        let mut t = Table::new(8);
        assert_eq!(client_share(8), 4);
        let a = t.insert(ip(1), Lane::Main, conn(now, 300, None, false));
        let _b = t.insert(ip(1), Lane::Main, conn(now, 500, None, true));
        let _c = t.insert(ip(1), Lane::Main, conn(now, 100, None, false));
        let _d = t.insert(ip(1), Lane::Main, conn(now, 200, None, false));
        // Another client's older idle connection is not touched.
        let _other = t.insert(ip(2), Lane::Main, conn(now, 900, None, false));
        assert_eq!(t.decide(ip(1), now), admit(Lane::Main, Some(a)));
        t.evict(a);
        t.insert(ip(1), Lane::Main, conn(now, 0, None, false));
        assert_eq!(t.decide(ip(2), now), admit(Lane::Main, None));
        // With only busy connections of its own, it gets a probe slot, not another's slot.
        let mut t = Table::new(2);
        t.insert(ip(1), Lane::Main, conn(now, 100, None, true));
        t.insert(ip(2), Lane::Main, conn(now, 900, None, false));
        assert_eq!(t.decide(ip(1), now), admit(Lane::Probe, None));
    }

    #[test]
    fn when_full_the_biggest_holder_loses_its_longest_idle_connection() {
        let now = Instant::now();
        let mut t = Table::new(5);
        let _scraper = t.insert(ip(9), Lane::Main, conn(now, 60_000, Some(10_000), false));
        let x1 = t.insert(ip(1), Lane::Main, conn(now, 50, None, false));
        let x2 = t.insert(ip(1), Lane::Main, conn(now, 80, None, false));
        let _x3 = t.insert(ip(1), Lane::Main, conn(now, 10, None, false));
        let _y = t.insert(ip(2), Lane::Main, conn(now, 5_000, None, false));
        // ip(1) holds three (its share): a new one from a fourth address takes ip(1)'s
        // oldest, not the scraper's, idle for 10 s, nor ip(2)'s older one.
        assert_eq!(t.decide(ip(3), now), admit(Lane::Main, Some(x2)));
        t.evict(x2);
        t.insert(ip(3), Lane::Main, conn(now, 0, None, false));
        assert_eq!(t.decide(ip(4), now), admit(Lane::Main, Some(x1)));
    }

    #[test]
    fn requests_in_flight_and_responses_still_moving_are_never_closed() {
        let now = Instant::now();
        let mut t = Table::new(3);
        t.insert(ip(1), Lane::Main, conn(now, 9_000, None, true));
        // Answered 1 s ago: the client may still be reading.
        t.insert(ip(2), Lane::Main, conn(now, 9_000, Some(1_000), false));
        let stalled = t.insert(ip(3), Lane::Main, conn(now, 9_000, Some(3_000), false));
        assert_eq!(t.decide(ip(4), now), admit(Lane::Main, Some(stalled)));
        t.evict(stalled);
        t.insert(ip(3), Lane::Main, conn(now, 0, None, true));
        // Nothing can go: the probe slots, then refusal.
        assert_eq!(t.decide(ip(4), now), admit(Lane::Probe, None));
        let p1 = t.insert(ip(4), Lane::Probe, conn(now, 300, None, false));
        let p2 = t.insert(ip(4), Lane::Probe, conn(now, 500, None, false));
        assert_eq!(t.decide(ip(5), now), admit(Lane::Probe, Some(p2)));
        t.evict(p2);
        t.insert(ip(5), Lane::Probe, conn(now, 0, None, true));
        assert_eq!(t.decide(ip(6), now), admit(Lane::Probe, Some(p1)));
        t.evict(p1);
        t.insert(ip(6), Lane::Probe, conn(now, 0, None, true));
        assert_eq!(t.decide(ip(7), now), Decision::Refuse);
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn removing_frees_the_client_share_and_the_probe_slots() {
        let now = Instant::now();
        let mut t = Table::new(2);
        let a = t.insert(ip(1), Lane::Main, conn(now, 10, None, true));
        assert_eq!(t.decide(ip(1), now), admit(Lane::Probe, None));
        let p = t.insert(ip(1), Lane::Probe, conn(now, 10, None, true));
        assert!(t.remove(a));
        assert!(!t.remove(a), "once");
        assert_eq!(t.decide(ip(1), now), admit(Lane::Main, None));
        assert!(t.remove(p));
        assert_eq!(t.len(), 0);
        assert!(t.per_client.is_empty());
        assert_eq!(t.probes, 0);
    }

    /// The adversary's log: one line at the first refusal, then silence while 17,999 more came
    /// — and the count never went out. Now the next line, a minute later, carries them all.
    #[tokio::test(start_paused = true)]
    async fn the_log_carries_the_true_count_since_its_previous_line() {
        let shed = Arc::new(Shed::default());
        let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
        let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&lines);
        let logger = tokio::spawn(log_shedding(Arc::clone(&shed), 64, closing_rx, move |l| {
            sink.lock().unwrap().push(l);
        }));
        let logged = || lines.lock().unwrap().clone();
        shed.count(&shed.refused);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(logged().len(), 1);
        assert!(
            logged()[0].contains("since start, 0 idle"),
            "{:?}",
            logged()
        );
        assert!(
            logged()[0].contains(", 1 connection(s) refused"),
            "{:?}",
            logged()
        );
        for _ in 0..17_999 {
            shed.count(&shed.refused);
        }
        for _ in 0..5 {
            shed.count(&shed.evicted);
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(logged().len(), 1, "at most a line a minute");
        tokio::time::sleep(Duration::from_secs(30)).await;
        let l = logged();
        assert_eq!(l.len(), 2, "{l:?}");
        assert!(
            l[1].starts_with("HTTP server: in the last 60 s, 5 idle"),
            "{}",
            l[1]
        );
        assert!(l[1].contains(", 17999 connection(s) refused"), "{}", l[1]);
        assert!(
            l[1].ends_with("since start: 5 closed, 18000 refused, 0 answered 503"),
            "{}",
            l[1]
        );
        // Nothing more: no line.
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert_eq!(logged().len(), 2);
        // What is left at shutdown is not lost.
        shed.count(&shed.probe_only);
        tokio::time::sleep(Duration::from_secs(1)).await;
        shed.count(&shed.probe_only);
        closing_tx.send(true).unwrap();
        logger.await.unwrap();
        let l = logged();
        assert_eq!(l.len(), 4, "{l:?}");
        assert!(l[3].contains(", 1 request(s) other than"), "{}", l[3]);
        assert!(
            l[3].ends_with("since start: 5 closed, 18000 refused, 2 answered 503"),
            "{}",
            l[3]
        );
    }
}
