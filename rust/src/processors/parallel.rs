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

/// Decoded pixels (by the images' headers) per thread of a batch's decode and resize when its
/// thread count is automatic ([`workers_for`]: `n` threads need `n` times this). Measured on the
/// AMD EPYC (Zen 3) VM of `docs/benchmarks.md` (extra E), two JPEGs of one size through
/// Qwen2-VL (`prepare`, `generate_request`, `serialize`), two threads against one, before this
/// limit: 2 × 128² pixels 0.76–0.99× as fast, with 39–77 % more CPU time; 2 × 192² 0.95–1.11×,
/// 34–51 % more; 2 × 256² 1.03–1.25×, 25–46 % more; 2 × 384² 1.30–1.42×; 2 × 512² 1.44–1.48×.
pub const MIN_PIXELS_PER_WORKER: u64 = 64 << 10;

/// Output bytes per writing thread when the thread count is automatic ([`workers_for`]: `n`
/// threads need `n` times this). On the same VM, Qwen2-VL's patches of two JPEGs written into a
/// request (`serialize` alone), two threads against one: 2 × 0.47 MB 0.60–0.79× as fast,
/// 2 × 0.92 MB 0.94–1.00×, 2 × 1.5 MB 1.06–1.12× with 49–60 % more CPU time, 2 × 3.7 MB
/// 0.80–1.37× (three runs), 2 × 6.6 MB 1.65×.
pub const MIN_BYTES_PER_WORKER: u64 = 2 << 20;

/// [`workers`] for `items` items that hold `work` units of work in all (pixels, bytes): with
/// `requested` 0 (automatic) no more threads than `work` holds `min_each` units for, so that a
/// small batch stays on the calling thread. A parallel region costs 48–66 µs before any work on
/// the benchmark VMs (the wake-ups between the vCPUs more than the thread's start), two thirds of
/// the decode of a 128 × 128 JPEG, and keeps the second core busy for nothing. A thread count the
/// caller gave is kept as it is.
pub fn workers_for(requested: usize, items: usize, work: u64, min_each: u64) -> usize {
    let n = workers(requested, items);
    if requested != 0 {
        return n;
    }
    let paid = usize::try_from(work / min_each.max(1)).unwrap_or(usize::MAX);
    n.min(paid).max(1)
}

/// [`workers_for`] a writer of `bytes` bytes of output in `items` jobs.
pub fn writers(requested: usize, items: usize, bytes: usize) -> usize {
    let work = u64::try_from(bytes).unwrap_or(u64::MAX);
    workers_for(requested, items, work, MIN_BYTES_PER_WORKER)
}

/// [`workers_for`] a batch of images of `pixels` decoded pixels in all.
pub fn decoders(requested: usize, items: usize, pixels: u64) -> usize {
    workers_for(requested, items, pixels, MIN_PIXELS_PER_WORKER)
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
    fn automatic_thread_counts_follow_the_work() {
        let cores = crate::cores::count();
        let each = MIN_PIXELS_PER_WORKER;
        // Automatic: one thread per `min_each` of work, at most one per core and per item.
        assert_eq!(workers_for(0, 8, 0, each), 1);
        assert_eq!(workers_for(0, 8, each - 1, each), 1);
        assert_eq!(workers_for(0, 8, 2 * each, each), cores.min(2));
        assert_eq!(workers_for(0, 8, 2 * each - 1, each), 1);
        assert_eq!(workers_for(0, 2, 100 * each, each), cores.min(2));
        assert_eq!(workers_for(0, 64, u64::MAX, each), cores.min(64));
        assert_eq!(
            workers_for(0, 4, 10, 0),
            cores.min(4),
            "no minimum: one per core"
        );
        // A count the caller gave is kept, whatever the work.
        assert_eq!(workers_for(3, 10, 0, each), 3);
        assert_eq!(workers_for(3, 2, 1, each), 2);
        assert_eq!(workers_for(1, 10, u64::MAX, each), 1);
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
