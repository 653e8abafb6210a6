//! What "one thread per core" (`threads = 0` everywhere in the API) means.

use std::num::NonZeroUsize;
use std::sync::OnceLock;

/// The cores this process may run on (`std::thread::available_parallelism`: the CPU affinity
/// mask and any cgroup CPU quota), read on first use and kept: reading the cgroup files costs
/// ~10 µs, which a call on a small image would otherwise pay every time. 1 when unknown.
pub fn count() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, NonZeroUsize::get))
}
