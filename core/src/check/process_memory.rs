//! A process's device memory as the driver reports it, read with
//! `nvidia-smi --query-compute-apps=pid,used_memory
//! --format=csv,noheader,nounits` of one GPU: a row per process holding a
//! context on it, its id and its memory in MiB (NVML's per-process figure:
//! every allocation of the process on that GPU, the context's own memory
//! included). A figure read this way is the same for any program, whatever
//! its allocator keeps or frees, so two programs measured alike can be
//! compared; a process is found by its id, unique on the host.
//!
//! Where the driver does not say (no `nvidia-smi`, `[N/A]` as under MIG or
//! WDDM, no row for the id, as in a container whose process ids are not the
//! host's), the figure is absent with the reason, never guessed.

use std::process::Command;

/// The query after `-i <bus id>`, as `nvidia-smi` takes it. A peer that
/// reads its own figure runs the same arguments.
pub const QUERY: [&str; 2] = [
    "--query-compute-apps=pid,used_memory",
    "--format=csv,noheader,nounits",
];

/// The device memory, MiB, of process `pid` on the GPU `bus_id` names
/// (the CUDA device's, from [`super::clocks::pci_bus_id`]), or why the
/// driver does not say.
pub fn process_mib(bus_id: &str, pid: u32) -> Result<u64, String> {
    mib_of(&compute_apps(bus_id)?, pid)
}

/// `nvidia-smi -i <bus_id>` with [`QUERY`]: its stdout, a row per process,
/// or why there is none.
pub fn compute_apps(bus_id: &str) -> Result<String, String> {
    let out = Command::new("nvidia-smi")
        .args(["-i", bus_id])
        .args(QUERY)
        .output()
        .map_err(|e| format!("nvidia-smi not run: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "nvidia-smi failed ({}): {}",
            out.status,
            text.trim()
        ))
    }
}

/// The MiB of process `pid` in `rows` (what [`compute_apps`] returns): the
/// sum of its rows (one per context it holds on the GPU), or why there is
/// no figure: no row for `pid`, or a row whose memory is not a number
/// (`[N/A]`, `[Insufficient Permissions]`). Lines that are not rows (a
/// "No running processes found") are passed over.
pub fn mib_of(rows: &str, pid: u32) -> Result<u64, String> {
    let mut total = None;
    for line in rows.lines() {
        let Some((id, mib)) = line.split_once(',') else {
            continue;
        };
        if id.trim().parse::<u32>().ok() != Some(pid) {
            continue;
        }
        let mib = mib.trim();
        let n: u64 = mib
            .parse()
            .map_err(|_| format!("nvidia-smi reports no memory for process {pid}: {mib:?}"))?;
        total = Some(total.unwrap_or(0) + n);
    }
    total.ok_or_else(|| {
        format!(
            "nvidia-smi lists no process {pid} on the GPU (a container with its own process \
             ids hides them from the driver): {:?}",
            rows.trim()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_of_the_process_is_read_in_mib() {
        assert_eq!(mib_of("430, 1542\n", 430), Ok(1542));
        assert_eq!(mib_of("430, 1542", 430), Ok(1542));
        // Another process of the same GPU is not ours, nor an id that
        // merely starts with ours.
        let rows = "4301, 900\n430, 1542\n7, 80000\n";
        assert_eq!(mib_of(rows, 430), Ok(1542));
        assert_eq!(mib_of(rows, 7), Ok(80000));
    }

    #[test]
    fn several_rows_of_one_process_add_up() {
        assert_eq!(mib_of("12, 1000\n99, 5\n12, 24\n", 12), Ok(1024));
    }

    #[test]
    fn an_absent_process_or_an_unreported_figure_is_no_figure() {
        let why = mib_of("431, 1542\n", 430).unwrap_err();
        assert!(why.contains("lists no process 430"), "{why}");
        let why = mib_of("", 430).unwrap_err();
        assert!(why.contains("lists no process 430"), "{why}");
        let why = mib_of("No running processes found\n", 430).unwrap_err();
        assert!(why.contains("No running processes found"), "{why}");
        let why = mib_of("430, [N/A]\n", 430).unwrap_err();
        assert!(
            why.contains("no memory for process 430: \"[N/A]\""),
            "{why}"
        );
        // One row of the process unreported leaves no figure for it.
        let why = mib_of("430, 100\n430, [N/A]\n", 430).unwrap_err();
        assert!(why.contains("[N/A]"), "{why}");
        let why = mib_of("430, [Insufficient Permissions]\n", 430).unwrap_err();
        assert!(why.contains("Insufficient Permissions"), "{why}");
    }

    #[test]
    fn without_nvidia_smi_or_a_driver_there_is_a_reason() {
        // On a machine with neither, the reading says why; with both, it is
        // this test process, which holds no context, so it is absent too.
        let why = super::super::clocks::pci_bus_id(0)
            .and_then(|id| process_mib(&id, std::process::id()))
            .unwrap_err();
        assert!(!why.is_empty());
    }
}
