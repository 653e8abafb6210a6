//! Records facts about the build that `build_info()` reports at run time.

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SMG_RUSTC_VERSION={version}");
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=SMG_BUILD_PROFILE={profile}");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=SMG_BUILD_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
    build_jpeg_shim();
}

/// Compiles the libjpeg half of the JPEG decoder (src/image/decode/jpeg_shim.c) against the
/// headers of the libjpeg-turbo that turbojpeg-sys builds from source (`DEP_TURBOJPEG_INCLUDE`).
fn build_jpeg_shim() {
    let shim = "src/image/decode/jpeg_shim.c";
    println!("cargo:rerun-if-changed={shim}");
    println!("cargo:rerun-if-env-changed=DEP_TURBOJPEG_INCLUDE");
    let mut build = cc::Build::new();
    build.file(shim).warnings(true);
    for dir in std::env::var("DEP_TURBOJPEG_INCLUDE")
        .unwrap_or_default()
        .split(',')
        .filter(|d| !d.is_empty())
    {
        build.include(dir);
    }
    build.compile("smg_jpeg_shim");
}
