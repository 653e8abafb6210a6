//! Which SIMD kernels may run, beyond what the CPU offers.
//!
//! Every kernel is chosen at run time from the CPU's features, and every choice gives the same
//! bytes. `SMG_GRPC_PROTO_NO_AVX512=1` (read once, at the first kernel choice) keeps the AVX-512
//! kernels off on a CPU that has them, so that the AVX2 ones can be measured or compared there.

use std::sync::OnceLock;

/// The variable that turns the AVX-512 kernels off.
pub const NO_AVX512_ENV: &str = "SMG_GRPC_PROTO_NO_AVX512";

/// Whether the AVX-512 kernels may be used (the CPU's features are checked separately).
pub fn avx512_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| {
        std::env::var(NO_AVX512_ENV).map_or(true, |v| matches!(v.trim(), "" | "0" | "false"))
    })
}
