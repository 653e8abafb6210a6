//! Speed of the Pillow-exact resize, per filter, scalar and SIMD, one thread and all cores.
//!
//! `cargo bench --bench resample [-- filter]`. Plain `std::time`; the figure is the best of
//! several runs. Images are RGB noise (speed does not depend on content).

use std::time::Instant;

use smg_grpc_proto::image::{resize_into, Filter, ImageRef, ResizeOptions};

fn main() {
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let cases = [
        ((512, 600), (504, 588)),
        ((1280, 960), (1288, 952)),
        ((1920, 1080), (1092, 616)),
        ((4032, 3024), (1008, 756)),
    ];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for ((w, h), (ow, oh)) in cases {
        let data: Vec<u8> = (0..w * h * 3)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 56) as u8
            })
            .collect();
        let src = ImageRef {
            data: &data,
            width: w,
            height: h,
            channels: 3,
        };
        let mut dst = vec![0u8; ow * oh * 3];
        for filter in [Filter::Bicubic, Filter::Bilinear, Filter::Lanczos] {
            if only.as_deref().is_some_and(|f| f != filter.name()) {
                continue;
            }
            let mut line = format!("{w}x{h} -> {ow}x{oh} {:8}", filter.name());
            for (simd, threads) in [(false, 1), (true, 1), (true, cores)] {
                let opts = ResizeOptions {
                    filter,
                    threads,
                    simd,
                    ..Default::default()
                };
                let mut best = f64::INFINITY;
                for _ in 0..15 {
                    let start = Instant::now();
                    resize_into(&src, &mut dst, ow, oh, &opts).expect("resize");
                    best = best.min(start.elapsed().as_secs_f64());
                }
                let label = if simd { "simd" } else { "scalar" };
                line += &format!("  {label} {threads}t {:7.3} ms", best * 1e3);
            }
            println!("{line}");
        }
    }
}
