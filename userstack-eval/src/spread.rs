//! Whether two sets of runs differ by more than their run-to-run spread: the exact two-sided
//! Mann-Whitney U test (the Wilcoxon rank-sum test), computed by enumerating every way the
//! pooled runs could have been split between the two sets. It assumes no distribution, only
//! that runs are independent; ties take their mean rank. With three runs a side the smallest
//! p it can give is 0.1, with five 0.008: a large p says the runs cannot tell the two apart,
//! not that they are the same.

/// The most runs, both sets together, that are enumerated (C(20, 10) = 184,756 splits).
pub const MAX_RUNS: usize = 20;

/// The two-sided p-value of the difference between `a` and `b`: the share of all splits of
/// the pooled runs into sets of their sizes whose rank sum lies at least as far from its
/// expectation as `a`'s does. `None` when a set is empty or there are more than
/// [`MAX_RUNS`] runs.
pub fn mann_whitney_p(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len() + b.len();
    if a.is_empty() || b.is_empty() || n > MAX_RUNS {
        return None;
    }
    let pooled: Vec<f64> = a.iter().chain(b).copied().collect();
    let ranks = midranks(&pooled);
    let observed: f64 = ranks[..a.len()].iter().sum();
    let expected = a.len() as f64 * (n as f64 + 1.0) / 2.0;
    // Rank sums are multiples of 0.5: a margin far below that keeps an equal distance equal.
    let distance = (observed - expected).abs() - 1e-9;
    let (mut extreme, mut splits) = (0u64, 0u64);
    each_subset_sum(&ranks, a.len(), &mut |sum| {
        splits += 1;
        if (sum - expected).abs() >= distance {
            extreme += 1;
        }
    });
    Some(extreme as f64 / splits as f64)
}

/// Ranks 1..=n of `values`, tied values sharing the mean of their ranks.
fn midranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&i, &j| values[i].total_cmp(&values[j]));
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && values[order[end]] == values[order[start]] {
            end += 1;
        }
        // Positions start..end hold ranks start+1..=end.
        let rank = (start + 1 + end) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = rank;
        }
        start = end;
    }
    ranks
}

/// Calls `f` with the sum of every subset of `values` of size `size`.
fn each_subset_sum(values: &[f64], size: usize, f: &mut dyn FnMut(f64)) {
    fn walk(values: &[f64], left: usize, sum: f64, f: &mut dyn FnMut(f64)) {
        if left == 0 {
            f(sum);
            return;
        }
        for i in 0..=values.len() - left {
            walk(&values[i + 1..], left - 1, sum + values[i], f);
        }
    }
    walk(values, size, 0.0, f);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn fully_separated_sets_give_the_smallest_p_their_sizes_allow() {
        // 2 of the C(6, 3) = 20 splits are as extreme: all low or all high.
        let p = mann_whitney_p(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).unwrap();
        assert!(close(p, 2.0 / 20.0), "{p}");
        let p = mann_whitney_p(&[6.0, 7.0, 8.0, 9.0, 10.0], &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert!(close(p, 2.0 / 252.0), "{p}");
    }

    #[test]
    fn interleaved_sets_cannot_be_told_apart() {
        let p = mann_whitney_p(&[1.0, 4.0, 5.0], &[2.0, 3.0, 6.0]).unwrap();
        assert!(close(p, 1.0), "{p}");
        // One run against one: either order is as extreme.
        assert!(close(mann_whitney_p(&[1.0], &[2.0]).unwrap(), 1.0));
    }

    #[test]
    fn one_run_out_of_place_is_counted_exactly() {
        // a = {1, 2, 4}, b = {3, 5, 6}: rank sum 7 against an expectation of 10.5; splits with
        // a sum of 7 or less are {1,2,3}, {1,2,4}; of 14 or more {3,5,6}, {4,5,6}: 4 of 20.
        let p = mann_whitney_p(&[1.0, 2.0, 4.0], &[3.0, 5.0, 6.0]).unwrap();
        assert!(close(p, 4.0 / 20.0), "{p}");
    }

    #[test]
    fn ties_share_their_ranks() {
        assert_eq!(midranks(&[5.0, 1.0, 5.0, 2.0]), vec![3.5, 1.0, 3.5, 2.0]);
        // Every value the same: every split is as extreme as any other.
        let p = mann_whitney_p(&[1.0, 1.0], &[1.0, 1.0, 1.0]).unwrap();
        assert!(close(p, 1.0), "{p}");
    }

    #[test]
    fn empty_or_too_many_runs_give_no_p() {
        assert_eq!(mann_whitney_p(&[], &[1.0]), None);
        assert_eq!(mann_whitney_p(&[1.0; 11], &[2.0; 10]), None);
        assert!(mann_whitney_p(&[1.0; 10], &[2.0; 10]).is_some());
    }
}
