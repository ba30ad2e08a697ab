//! The process environment of one trial.
//!
//! aprender-train is switched by environment variables, most of them read
//! once per process into a `static OnceLock`:
//!
//! - `CUDA_GRAPH == "1"` turns on both the forward graph
//!   (T:finetune/instruct_pipeline/cuda_forward.rs:77-79) and the backward
//!   graph (T:finetune/backward_graph.rs:30-33). Read once, never again: a
//!   graphed and an un-graphed run are two processes.
//! - The module disk cache is `$HOME/.cache/trueno/ptx/` and reads `HOME`
//!   only (G:driver/ptx_cache.rs:214-223); the VRAM ledger is
//!   `dirs::cache_dir()/entrenar/gpu-ledger.json` (T:gpu/ledger.rs:33-38),
//!   i.e. `$XDG_CACHE_HOME` when set. A fresh `HOME` per trial makes the
//!   pre-warm cold (the in-process caches are statics, so cold also needs a
//!   fresh process: T:autograd/cuda_forward/cache.rs:30, cuda_backward/cache.rs:21,
//!   cuda_optim.rs:45).
//! - Measurement knobs, pinned off so an inherited value cannot change the
//!   subject under test; each is on only when exactly `"1"`: `APR_NAN_SCAN`
//!   (T:transformer/cuda_block.rs:83), `FP16_GEMM` (cuda_init.rs:363,
//!   cuda_block.rs:3236), `NF4_FUSED_GEMM` (:3232), `NF4_TC_GEMM` (:3234),
//!   `NF4_TC_BWD_GEMM` (:4120), `NF4_FUSED_BWD_GEMM` (:4196),
//!   `APR_ORD9_DRAIN_SKIP` (G:driver/memory/transfer.rs:137),
//!   `APR_STREAM_NONBLOCKING` (G:driver/stream.rs:70-76, 91).
//! - `APR_DISTILL_SMOKE_SEQ_LEN` picks the second RoPE length the pre-warm
//!   warms (T:autograd/cuda_forward/cache.rs:344-347); pinned to its default.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::model::Setup;

/// aprender-train's switches that are on only when exactly `"1"`, pinned off.
const PINNED_OFF: [&str; 8] = [
    "APR_NAN_SCAN",
    "FP16_GEMM",
    "NF4_FUSED_GEMM",
    "NF4_TC_GEMM",
    "NF4_TC_BWD_GEMM",
    "NF4_FUSED_BWD_GEMM",
    "APR_ORD9_DRAIN_SKIP",
    "APR_STREAM_NONBLOCKING",
];

/// `APR_DISTILL_SMOKE_SEQ_LEN`'s default (T:autograd/cuda_forward/cache.rs:347).
const SMOKE_SEQ_LEN_DEFAULT: &str = "256";

/// The variables a trial process needs beside the inherited environment:
/// `CUDA_GRAPH` from `setup.graph` (`"0"` when off, so an inherited `1`
/// cannot graph the un-graphed arm), `HOME = home` and
/// `XDG_CACHE_HOME = home/.cache` (a fresh, empty `home` per trial gives a
/// cold module cache and a private VRAM ledger; the caller creates and
/// removes it), and aprender-train's other switches pinned to their defaults.
pub fn process_env(setup: &Setup, home: &Path) -> Vec<(String, String)> {
    let mut vars = graph_env(setup);
    vars.push(("HOME".into(), home.display().to_string()));
    vars.push((
        "XDG_CACHE_HOME".into(),
        home.join(".cache").display().to_string(),
    ));
    vars.extend(PINNED_OFF.iter().map(|name| (name.to_string(), "0".into())));
    vars.push((
        "APR_DISTILL_SMOKE_SEQ_LEN".into(),
        SMOKE_SEQ_LEN_DEFAULT.into(),
    ));
    vars
}

/// Only the graph switch: `CUDA_GRAPH=1` or `CUDA_GRAPH=0`.
pub fn graph_env(setup: &Setup) -> Vec<(String, String)> {
    let value = if setup.graph { "1" } else { "0" };
    vec![("CUDA_GRAPH".into(), value.into())]
}

/// Where `nvidia-smi` is on `path` (a `PATH` value), if anywhere.
/// aprender-train shells out to it to size its VRAM guard and silently
/// trains on the CPU without it (T:gpu/ledger.rs:405-483, 505-510).
pub fn find_nvidia_smi(path: Option<&OsStr>) -> Option<PathBuf> {
    let path = path?;
    std::env::split_paths(path)
        .map(|dir| dir.join("nvidia-smi"))
        .find(|candidate| candidate.is_file())
}

/// Where `nvidia-smi` is installed when it is not on `PATH`: the NVIDIA
/// container runtime's folder first.
const NVIDIA_SMI_DIRS: [&str; 3] = ["/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin"];

/// A `PATH` for a trial process that finds `nvidia-smi`: `None` when `path`
/// (the inherited value) already does, or when none of the usual folders
/// holds it (the session then refuses to start, [`crate::Error::NoNvidiaSmi`]);
/// else `path` with the first folder that holds it appended.
pub fn path_with_nvidia_smi(path: Option<&OsStr>) -> Option<String> {
    path_with_nvidia_smi_in(path, &NVIDIA_SMI_DIRS.map(Path::new))
}

fn path_with_nvidia_smi_in(path: Option<&OsStr>, dirs: &[&Path]) -> Option<String> {
    if find_nvidia_smi(path).is_some() {
        return None;
    }
    let dir = dirs.iter().find(|dir| dir.join("nvidia-smi").is_file())?;
    let mut parts: Vec<PathBuf> = path
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    parts.push(dir.to_path_buf());
    std::env::join_paths(parts)
        .ok()
        .map(|joined| joined.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
        vars.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    #[test]
    fn the_graph_switch_follows_the_setup() {
        let mut setup = Setup::new("qwen2-tiny-4l");
        let home = Path::new("/tmp/trial-7");
        assert_eq!(value(&process_env(&setup, home), "CUDA_GRAPH"), Some("0"));
        setup.graph = true;
        let vars = process_env(&setup, home);
        assert_eq!(value(&vars, "CUDA_GRAPH"), Some("1"));
        assert_eq!(graph_env(&setup), vec![("CUDA_GRAPH".into(), "1".into())]);
    }

    #[test]
    fn the_caches_live_in_the_given_home() {
        let vars = process_env(&Setup::new("qwen2-tiny-4l"), Path::new("/tmp/trial-7"));
        assert_eq!(value(&vars, "HOME"), Some("/tmp/trial-7"));
        assert_eq!(value(&vars, "XDG_CACHE_HOME"), Some("/tmp/trial-7/.cache"));
        assert_eq!(value(&vars, "APR_NAN_SCAN"), Some("0"));
        assert_eq!(value(&vars, "APR_DISTILL_SMOKE_SEQ_LEN"), Some("256"));
        let mut names: Vec<_> = vars.iter().map(|(key, _)| key).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), vars.len(), "a variable is set twice");
    }

    #[test]
    fn nvidia_smi_is_found_only_where_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::env::join_paths([Path::new("/nonexistent"), dir.path()]).unwrap();
        assert_eq!(find_nvidia_smi(Some(&path)), None);
        std::fs::write(dir.path().join("nvidia-smi"), b"").unwrap();
        assert_eq!(
            find_nvidia_smi(Some(&path)),
            Some(dir.path().join("nvidia-smi"))
        );
        assert_eq!(find_nvidia_smi(None), None);
    }

    #[test]
    fn a_path_without_nvidia_smi_gets_the_folder_that_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let empty = tempfile::tempdir().unwrap();
        let inherited = std::ffi::OsString::from("/bin");
        assert_eq!(
            path_with_nvidia_smi_in(Some(&inherited), &[empty.path(), dir.path()]),
            None
        );
        std::fs::write(dir.path().join("nvidia-smi"), b"").unwrap();
        let path = path_with_nvidia_smi_in(Some(&inherited), &[empty.path(), dir.path()]).unwrap();
        assert_eq!(path, format!("/bin:{}", dir.path().display()));
        let found = std::ffi::OsString::from(&path);
        assert_eq!(path_with_nvidia_smi_in(Some(&found), &[dir.path()]), None);
    }
}
