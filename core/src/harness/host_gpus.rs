//! The host's GPUs as the NVIDIA kernel driver lists them, read without
//! starting CUDA, so that a trial process that works on one GPU can make
//! that GPU the only one its CUDA sees before CUDA starts.
//!
//! `cuInit` sets up every GPU the process can see, and on a host of
//! several GPUs that is most of a trial process's fixed cost: on four
//! H200s, 1.0-1.05 s against 0.19-0.20 s for a process that sees one GPU
//! (a lab script, fresh processes one at a time;
//! docs/src/performance/suite-time.md). So the harness sets
//! `CUDA_VISIBLE_DEVICES` to the UUID of its trial's GPU where the trial
//! works on one GPU, and the caller did not choose the visible GPUs.
//!
//! The list is `/proc/driver/nvidia/gpus/<PCI bus id>/information`, one
//! folder per GPU given to this machine or container, in PCI order; each
//! names its GPU's UUID (`GPU UUID: GPU-8f7d847d-...`), as `nvidia-smi -L`
//! and `CUDA_VISIBLE_DEVICES` spell it.

use std::path::Path;

/// The folder the NVIDIA driver lists its GPUs in.
pub const PROC_GPUS: &str = "/proc/driver/nvidia/gpus";

/// CUDA's own setting of which GPUs a process sees.
pub const VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// The UUIDs of the GPUs listed under `dir` (one folder per GPU, named by
/// PCI bus id), in the order of their folders' names; `None` where the
/// folder is absent, lists no GPU, or a GPU's UUID cannot be read.
pub fn listed_in(dir: &Path) -> Option<Vec<String>> {
    let mut folders: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    folders.sort();
    let uuids: Option<Vec<String>> = folders
        .iter()
        .map(|f| uuid_in(&std::fs::read_to_string(f.join("information")).ok()?))
        .collect();
    uuids.filter(|u| !u.is_empty())
}

/// The UUID an `information` file names (`GPU UUID: \t GPU-...`).
pub fn uuid_in(information: &str) -> Option<String> {
    information.lines().find_map(|line| {
        let value = line.strip_prefix("GPU UUID:")?.trim();
        value.starts_with("GPU-").then(|| value.to_string())
    })
}

/// The host's GPUs (their UUIDs, in PCI order) where this process may pick
/// among them itself: the driver lists them, and the caller did not set
/// `CUDA_VISIBLE_DEVICES` (then CUDA's own numbering of what the caller
/// left visible is the one to follow).
pub fn for_this_process() -> Option<Vec<String>> {
    if std::env::var_os(VISIBLE_DEVICES).is_some() {
        return None;
    }
    listed_in(Path::new(PROC_GPUS))
}

/// The lock file's name of the GPU `uuid` (`GPU-8f7d847d-2caa-...`): the
/// same as [`super::gpu_locks::gpu_name`] gives from CUDA's UUID of that
/// GPU (`gpu-8f7d847d2caa...`), so processes that name it either way agree.
pub fn lock_name(uuid: &str) -> String {
    let hex: String = uuid
        .trim_start_matches("GPU-")
        .chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    format!("gpu-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFORMATION: &str = "Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\n\
        GPU UUID: \t GPU-8f7d847d-2caa-e226-4db6-cff1db3be9f8\nVideo BIOS: \t ??.??\n";

    #[test]
    fn the_uuid_is_read_from_the_drivers_information_file() {
        assert_eq!(
            uuid_in(INFORMATION).as_deref(),
            Some("GPU-8f7d847d-2caa-e226-4db6-cff1db3be9f8")
        );
        assert_eq!(uuid_in("Model: \t\t NVIDIA H200\n"), None);
    }

    #[test]
    fn gpus_are_listed_in_pci_order_and_an_unreadable_one_voids_the_list() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(listed_in(dir.path()), None, "no GPU listed");
        for (bus, last) in [("0000:00:07.0", "7"), ("0000:00:06.0", "6")] {
            let gpu = dir.path().join(bus);
            std::fs::create_dir(&gpu).expect("mkdir");
            let info = INFORMATION.replace("9f8", &format!("9f{last}"));
            std::fs::write(gpu.join("information"), info).expect("write");
        }
        let listed = listed_in(dir.path()).expect("two GPUs");
        assert_eq!(listed.len(), 2);
        assert!(
            listed[0].ends_with("9f6") && listed[1].ends_with("9f7"),
            "{listed:?}"
        );
        std::fs::create_dir(dir.path().join("0000:00:08.0")).expect("mkdir");
        assert_eq!(listed_in(dir.path()), None, "a GPU without its information");
        assert_eq!(listed_in(&dir.path().join("absent")), None);
    }

    #[test]
    fn a_uuids_lock_name_is_the_one_cuda_s_uuid_gives() {
        assert_eq!(
            lock_name("GPU-8f7d847d-2caa-e226-4db6-cff1db3be9f8"),
            "gpu-8f7d847d2caae2264db6cff1db3be9f8"
        );
    }
}
