//! Throughput of the tensor conversions, single- and multi-threaded.
//!
//! `cargo bench --bench convert [-- MiB]` (default 100 MiB of float32 input). Plain `std::time`
//! so that no benchmark framework is needed; the figure is the best of several runs, in GB/s of
//! input read.

use std::time::Instant;

use smg_grpc_proto::tensor::convert::convert_into_threads;
use smg_grpc_proto::tensor::WireDtype;

fn main() {
    let mib: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100);
    let n = mib << 20;
    // Deterministic, varied bit patterns (finite values mostly, some specials).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let src: Vec<u8> = (0..n / 4)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = ((state >> 40) as f32 / 16_777_216.0 - 0.5) * 8.0;
            v.to_le_bytes()
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cases = [
        ("copy float32", WireDtype::Float32),
        ("float32 -> bfloat16", WireDtype::Bfloat16),
        ("float32 -> float16", WireDtype::Float16),
    ];
    for (name, to) in cases {
        let mut dst = vec![0u8; n / 4 * to.itemsize()];
        for t in [1, threads] {
            let mut best = f64::INFINITY;
            for _ in 0..7 {
                let start = Instant::now();
                convert_into_threads(&src, WireDtype::Float32, &mut dst, to, t).expect("convert");
                best = best.min(start.elapsed().as_secs_f64());
            }
            println!(
                "{name:22} {mib} MiB, {t} thread(s): {:6.2} ms  {:6.2} GB/s",
                best * 1e3,
                n as f64 / best / 1e9
            );
        }
    }
}
