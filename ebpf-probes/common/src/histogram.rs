//! Log2 latency histograms: the run-queue and wake-up latencies of [`crate::SchedStats`] and the
//! wait times of [`crate::FutexStats`]. Recorded by the kernel's `sched.rs` and `futex.rs`; read
//! by the agent's `collect`, `counters` and `report.rs`, exported by `export/encode.rs`.

/// Number of log2 buckets in a latency histogram. Bucket `b` counts values `v` (in ns) with
/// `bit_length(v) == b`, i.e. `2^(b-1) <= v < 2^b`; bucket 0 counts zeros. The last bucket also
/// takes everything larger: `2^(LOG2_BUCKETS-2)` ns is about 1.07 s.
pub const LOG2_BUCKETS: usize = 32;

/// The bucket of a value in ns: its bit length, clamped to the last bucket.
#[inline(always)]
pub const fn log2_bucket(value_ns: u64) -> usize {
    let bits = (u64::BITS - value_ns.leading_zeros()) as usize;
    if bits >= LOG2_BUCKETS {
        LOG2_BUCKETS - 1
    } else {
        bits
    }
}

/// A log2 histogram of nanosecond values, with its count and exact sum.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Log2Histogram {
    pub count: u64,
    pub sum_ns: u64,
    pub buckets: [u64; LOG2_BUCKETS],
}

impl Log2Histogram {
    pub const ZERO: Self = Self {
        count: 0,
        sum_ns: 0,
        buckets: [0; LOG2_BUCKETS],
    };

    #[inline(always)]
    pub fn record(&mut self, value_ns: u64) {
        self.count += 1;
        self.sum_ns += value_ns;
        let b = log2_bucket(value_ns);
        // The bound check keeps the verifier happy; `log2_bucket` never exceeds it.
        if b < LOG2_BUCKETS {
            self.buckets[b] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn log2_buckets_are_bit_lengths() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 1);
        assert_eq!(log2_bucket(2), 2);
        assert_eq!(log2_bucket(3), 2);
        assert_eq!(log2_bucket(4), 3);
        assert_eq!(log2_bucket(1023), 10);
        assert_eq!(log2_bucket(1024), 11);
        assert_eq!(log2_bucket(u64::MAX), LOG2_BUCKETS - 1);
        assert_eq!(log2_bucket(1 << 40), LOG2_BUCKETS - 1);
    }

    #[test]
    fn histogram_records_count_sum_and_bucket() {
        let mut h = Log2Histogram::ZERO;
        h.record(1500);
        h.record(1500);
        h.record(3);
        assert_eq!(h.count, 3);
        assert_eq!(h.sum_ns, 3003);
        assert_eq!(h.buckets[11], 2);
        assert_eq!(h.buckets[2], 1);
    }

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<Log2Histogram>(), 8 * (2 + LOG2_BUCKETS));
    }
}
