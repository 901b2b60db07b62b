//! With the `libfabric` feature: compiles `csrc/shim.c` against the installed libfabric
//! headers and links `libfabric`. `LIBFABRIC_DIR` names an installation outside the system's
//! paths (its `include` and `lib` directories), as on clusters that load it as a module.
fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-env-changed=LIBFABRIC_DIR");
    #[cfg(feature = "libfabric")]
    {
        let mut build = cc::Build::new();
        build
            .file("csrc/shim.c")
            .warnings(true)
            .extra_warnings(true);
        if let Some(dir) = std::env::var_os("LIBFABRIC_DIR") {
            let dir = std::path::PathBuf::from(dir);
            build.include(dir.join("include"));
            println!(
                "cargo:rustc-link-search=native={}",
                dir.join("lib").display()
            );
        }
        build.compile("amofi_shim");
        println!("cargo:rustc-link-lib=fabric");
    }
}
