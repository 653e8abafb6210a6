//! What was built, how, and which CPU features the running machine offers.
//!
//! Users attach this to bug reports (`smg_grpc_proto.build_info()`); the test suite uses it to
//! prove that the wheel it imports is the one it just built.

/// Facts fixed when the crate was compiled, plus CPU features detected at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildInfo {
    /// The crate version; equals the Python package version.
    pub version: &'static str,
    /// `release` or `debug`.
    pub profile: &'static str,
    /// The target triple the extension was compiled for.
    pub target: &'static str,
    /// `rustc --version` of the compiler used.
    pub rustc: &'static str,
    /// SIMD features the running CPU supports (detected now, not at build time).
    pub cpu_features: Vec<&'static str>,
}

/// Returns the build facts of this binary.
pub fn build_info() -> BuildInfo {
    BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        profile: env!("SMG_BUILD_PROFILE"),
        target: env!("SMG_BUILD_TARGET"),
        rustc: env!("SMG_RUSTC_VERSION"),
        cpu_features: cpu_features(),
    }
}

#[cfg(target_arch = "x86_64")]
fn cpu_features() -> Vec<&'static str> {
    let mut found = Vec::new();
    if std::arch::is_x86_feature_detected!("sse4.1") {
        found.push("sse4.1");
    }
    if std::arch::is_x86_feature_detected!("avx2") {
        found.push("avx2");
    }
    for (name, on) in [
        ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
        ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
        (
            "avx512vbmi",
            std::arch::is_x86_feature_detected!("avx512vbmi"),
        ),
        (
            "avx512vnni",
            std::arch::is_x86_feature_detected!("avx512vnni"),
        ),
    ] {
        // Listed only when the AVX-512 kernels may use them (`SMG_GRPC_PROTO_NO_AVX512`).
        if on && crate::simd::avx512_allowed() {
            found.push(name);
        }
    }
    if std::arch::is_x86_feature_detected!("f16c") {
        found.push("f16c");
    }
    found
}

#[cfg(target_arch = "aarch64")]
fn cpu_features() -> Vec<&'static str> {
    let mut found = Vec::new();
    if std::arch::is_aarch64_feature_detected!("neon") {
        found.push("neon");
    }
    if std::arch::is_aarch64_feature_detected!("fp16") {
        found.push("fp16");
    }
    found
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn cpu_features() -> Vec<&'static str> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_matches_the_manifest() {
        let info = build_info();
        assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
        assert!(info.version.split('.').count() == 3, "{}", info.version);
    }

    #[test]
    fn profile_and_target_are_recorded() {
        let info = build_info();
        assert!(
            matches!(info.profile, "debug" | "release"),
            "{}",
            info.profile
        );
        assert!(
            info.target.contains(std::env::consts::ARCH),
            "{}",
            info.target
        );
        assert!(info.rustc.starts_with("rustc "), "{}", info.rustc);
    }

    #[test]
    fn detected_features_are_unique() {
        let mut features = build_info().cpu_features;
        let n = features.len();
        features.dedup();
        assert_eq!(n, features.len());
    }
}
