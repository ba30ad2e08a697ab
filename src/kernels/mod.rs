//! CUDA C sources, one file per kernel family, compiled by NVRTC at run time
//! for the device's own architecture. Kernel symbols are `{op}_{pass}_{dtype}`.

/// One compilable module: a family of kernels in one `.cu` file.
#[derive(Debug, Clone, Copy)]
pub struct ModuleSource {
    /// Module name (the file stem).
    pub name: &'static str,
    pub source: &'static str,
    /// The `extern "C"` kernels the module defines.
    pub symbols: &'static [&'static str],
}

macro_rules! module {
    ($name:literal, [$($sym:literal),* $(,)?]) => {
        ModuleSource {
            name: $name,
            source: include_str!(concat!($name, ".cu")),
            symbols: &[$($sym),*],
        }
    };
}

/// Every kernel module of the system under test.
pub const MODULES: &[ModuleSource] = &[
    module!("embedding", []),
    module!("rmsnorm", []),
    module!("rope", []),
    module!("softmax", []),
    module!("activation", []),
    module!("elementwise", []),
    module!("cross_entropy", []),
    module!("clip", []),
    module!("adamw", []),
    module!("gemm", []),
    module!("nf4", []),
    module!("cast", []),
    module!("attention", []),
];

/// The module called `name`.
pub fn module(name: &str) -> Option<&'static ModuleSource> {
    MODULES.iter().find(|m| m.name == name)
}
