//! The one median of the tests and their tools (the corpus's figures, the soak test's memory).
//! xtask's benchmarks keep their own (`xtask/src/bench_common.rs`): xtask does not depend on
//! this crate, and theirs is the mean of the middle two of an even count, not the upper one.

use std::cmp::Ordering;

/// The upper median of `v` in the order `cmp`: the middle item of an odd count, the upper of
/// the middle two of an even count (not their mean: it is one of the items), `None` of nothing.
/// `cmp` must be a total order (`Ord::cmp`, `f64::total_cmp`); what to leave out (NaN…) and
/// what nothing gives are the caller's.
pub fn median<T>(v: impl IntoIterator<Item = T>, cmp: impl FnMut(&T, &T) -> Ordering) -> Option<T> {
    let mut v: Vec<T> = v.into_iter().collect();
    if v.is_empty() {
        return None;
    }
    let mid = v.len() / 2;
    v.select_nth_unstable_by(mid, cmp);
    Some(v.swap_remove(mid))
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_middle_of_an_odd_count_the_upper_middle_of_an_even_one() {
        assert_eq!(median([3u64, 1, 2], u64::cmp), Some(2));
        assert_eq!(median([4u64, 1, 3, 2], u64::cmp), Some(3));
        assert_eq!(median([7u64], u64::cmp), Some(7));
        assert_eq!(median([5u64, 5, 1, 5], u64::cmp), Some(5));
        assert_eq!(median(Vec::<u64>::new(), u64::cmp), None);
        assert_eq!(median([2.5, -1.0, 0.5, 9.0], f64::total_cmp), Some(2.5));
        // NaN is not left out here: in `total_cmp` it sorts above every number.
        assert_eq!(median([f64::NAN, 1.0, 2.0], f64::total_cmp), Some(2.0));
    }

    /// The corpus's median (`corpus::median`), on the shared one: of the finite figures only,
    /// NaN when there are none. Tested here to leave corpus.rs to the cases.
    #[test]
    fn the_corpus_takes_the_median_of_its_finite_figures() {
        use crate::corpus::median;
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(vec![f64::NAN, 1.0, f64::INFINITY, 2.0]), 2.0);
        assert!(median(vec![f64::NAN, f64::NEG_INFINITY]).is_nan());
        assert!(median(vec![]).is_nan());
    }
}
