//! Items of a batch on several threads, results in input order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The thread count for `requested` (0: one per core) and `items` items.
pub fn workers(requested: usize, items: usize) -> usize {
    let cap = if requested == 0 {
        crate::cores::count()
    } else {
        requested
    };
    cap.min(items).max(1)
}

/// Applies `f` to every item on `threads` threads (the calling thread included); returns the
/// results in the order of `items`. Items are handed out one at a time, so uneven items balance.
pub fn map<T, R, F>(items: Vec<T>, threads: usize, f: F) -> Vec<R>
where
    T: Send,
    R: Send,
    F: Fn(usize, T) -> R + Sync,
{
    map_in_order(items, threads, &[], f)
}

/// The hand-out order of `costs.len()` items: the costliest first (ties in input order). A
/// batch whose largest image comes last would otherwise leave every other thread idle while one
/// thread works through it (longest-processing-time-first scheduling).
pub fn costliest_first(costs: &[u64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(costs[i]));
    order
}

/// [`map`] handing the items out in `order` (a permutation of the indices; empty or invalid:
/// input order). Results are still returned in the order of `items`.
pub fn map_in_order<T, R, F>(items: Vec<T>, threads: usize, order: &[usize], f: F) -> Vec<R>
where
    T: Send,
    R: Send,
    F: Fn(usize, T) -> R + Sync,
{
    let n = items.len();
    if threads <= 1 || n <= 1 {
        return items
            .into_iter()
            .enumerate()
            .map(|(i, t)| f(i, t))
            .collect();
    }
    let permutation = order.len() == n && {
        let mut seen = vec![false; n];
        order
            .iter()
            .all(|&i| i < n && !std::mem::replace(&mut seen[i], true))
    };
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let work = || loop {
        let k = next.fetch_add(1, Ordering::Relaxed);
        if k >= n {
            break;
        }
        let i = if permutation { order[k] } else { k };
        // Each index is taken by exactly one thread, so the locks never contend; a poisoned lock
        // (a panic in `f` on another item) still holds its value.
        let item = slots[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(item) = item {
            let r = f(i, item);
            *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads.min(n) {
            // A thread that cannot be spawned (e.g. no address space left for its stack) is
            // simply missing: `spawn_scoped` reports it instead of panicking, and the calling
            // thread's `work` below drains the queue.
            if std::thread::Builder::new()
                .spawn_scoped(scope, work)
                .is_err()
            {
                break;
            }
        }
        work();
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every item is processed before the scope ends")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_kept() {
        let items: Vec<usize> = (0..100).collect();
        for threads in [1, 2, 7] {
            let out = map(items.clone(), threads, |i, x| {
                assert_eq!(i, x);
                x * 2
            });
            assert_eq!(out, (0..100).map(|x| x * 2).collect::<Vec<_>>());
        }
        assert!(map(Vec::<u8>::new(), 4, |_, x| x).is_empty());
        assert_eq!(workers(0, 1), 1);
        assert_eq!(workers(3, 10), 3);
        assert_eq!(workers(3, 2), 2);
    }

    #[test]
    fn costliest_first_order_keeps_results_in_input_order() {
        assert_eq!(costliest_first(&[3, 9, 1, 9, 5]), [1, 3, 4, 0, 2]);
        assert!(costliest_first(&[]).is_empty());
        let items: Vec<usize> = (0..50).collect();
        let costs: Vec<u64> = (0..50).map(|i| (i * 37 % 50) as u64).collect();
        let order = costliest_first(&costs);
        for threads in [1, 2, 5] {
            // the first item taken is the costliest one
            let started = std::sync::Mutex::new(Vec::new());
            let out = map_in_order(items.clone(), threads, &order, |i, x| {
                started.lock().unwrap().push(i);
                assert_eq!(i, x);
                x + 1
            });
            assert_eq!(out, (1..51).collect::<Vec<_>>());
            let started = started.into_inner().unwrap();
            if threads == 1 {
                // one thread: nothing to balance, input order
                assert_eq!(started, (0..50).collect::<Vec<_>>());
            } else {
                assert!(order[..threads].contains(&started[0]));
            }
        }
        // an order that is not a permutation of the indices falls back to input order
        for bad in [vec![0, 0, 1], vec![0, 1], vec![0, 1, 7]] {
            let out = map_in_order(vec![10, 20, 30], 2, &bad, |i, x| (i, x));
            assert_eq!(out, [(0, 10), (1, 20), (2, 30)]);
        }
    }
}
