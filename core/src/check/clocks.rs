//! The GPU's clocks and clock-event (throttle) reasons around a timed
//! region, and whether they make the timing untrustworthy.
//!
//! A reading is `nvidia-smi --query-gpu=clocks.sm,clocks.mem,
//! clocks_event_reasons.active` of one GPU: SM and memory clocks in MHz and
//! NVML's `nvmlClocksEventReasons` bitmask. A measurement is *throttled*
//! when either reading (before or after) holds a reason that slows the
//! clocks below what was asked for: SW or HW thermal slowdown, HW slowdown,
//! HW power brake. A power cap, an idle GPU or an application clock setting
//! is recorded, not judged. Without `nvidia-smi` (or on a driver that does
//! not answer) the clocks are unknown, said so, and the measurement judged.

use std::process::Command;

/// NVML's `nvmlClocksEventReasonGpuIdle`.
pub const GPU_IDLE: u64 = 0x1;
/// NVML's `nvmlClocksEventReasonApplicationsClocksSetting`.
pub const APPLICATIONS_CLOCKS: u64 = 0x2;
/// NVML's `nvmlClocksEventReasonSwPowerCap`.
pub const SW_POWER_CAP: u64 = 0x4;
/// NVML's `nvmlClocksThrottleReasonHwSlowdown`.
pub const HW_SLOWDOWN: u64 = 0x8;
/// NVML's `nvmlClocksEventReasonSyncBoost`.
pub const SYNC_BOOST: u64 = 0x10;
/// NVML's `nvmlClocksEventReasonSwThermalSlowdown`.
pub const SW_THERMAL: u64 = 0x20;
/// NVML's `nvmlClocksThrottleReasonHwThermalSlowdown`.
pub const HW_THERMAL: u64 = 0x40;
/// NVML's `nvmlClocksThrottleReasonHwPowerBrakeSlowdown`.
pub const HW_POWER_BRAKE: u64 = 0x80;
/// NVML's `nvmlClocksEventReasonDisplayClockSetting`.
pub const DISPLAY_CLOCK: u64 = 0x100;

/// The reasons that make a timing throttled.
pub const THROTTLING: u64 = SW_THERMAL | HW_THERMAL | HW_SLOWDOWN | HW_POWER_BRAKE;

/// Each reason bit and its name, for messages.
const NAMES: &[(u64, &str)] = &[
    (GPU_IDLE, "idle"),
    (APPLICATIONS_CLOCKS, "applications clocks"),
    (SW_POWER_CAP, "SW power cap"),
    (HW_SLOWDOWN, "HW slowdown"),
    (SYNC_BOOST, "sync boost"),
    (SW_THERMAL, "SW thermal slowdown"),
    (HW_THERMAL, "HW thermal slowdown"),
    (HW_POWER_BRAKE, "HW power brake"),
    (DISPLAY_CLOCK, "display clock"),
];

/// One reading of a GPU's clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    pub sm_mhz: u32,
    pub mem_mhz: u32,
    /// The active clock-event reasons, NVML's bitmask.
    pub reasons: u64,
}

/// The names of the reasons in `mask`, comma-separated ("none" for 0;
/// unnamed bits in hex).
pub fn reason_names(mask: u64) -> String {
    let mut names: Vec<String> = NAMES
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, name)| (*name).to_string())
        .collect();
    let unnamed = mask & !NAMES.iter().fold(0, |all, (bit, _)| all | bit);
    if unnamed != 0 {
        names.push(format!("{unnamed:#x}"));
    }
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Parses one line of `nvidia-smi --query-gpu=clocks.sm,clocks.mem,
/// clocks_event_reasons.active --format=csv,noheader,nounits`, e.g.
/// `1980, 2619, 0x0000000000000000`; `None` for anything else (a
/// `[N/A]`, an error message).
pub fn parse_reading(line: &str) -> Option<ClockReading> {
    let mut fields = line.split(',').map(str::trim);
    let sm_mhz = fields.next()?.parse().ok()?;
    let mem_mhz = fields.next()?.parse().ok()?;
    let hex = fields.next()?;
    let reasons = u64::from_str_radix(hex.strip_prefix("0x")?, 16).ok()?;
    fields.next().is_none().then_some(ClockReading {
        sm_mhz,
        mem_mhz,
        reasons,
    })
}

/// A reader of CUDA device `ordinal`'s clocks for [`watched`]: the device is
/// named to `nvidia-smi` by its PCI bus id ([`pci_bus_id`], looked up once),
/// and each call is one reading or the reason there is none. Drivers before
/// the clock-event naming know the same bitmask as
/// `clocks_throttle_reasons.active`, asked for when the first query fails.
pub fn reader(ordinal: usize) -> impl FnMut() -> Result<ClockReading, String> {
    let id = pci_bus_id(ordinal);
    move || {
        let id = id.as_deref().map_err(Clone::clone)?;
        query(id, "clocks_event_reasons.active")
            .or_else(|_| query(id, "clocks_throttle_reasons.active"))
    }
}

/// The PCI bus id of CUDA device `ordinal` as nvidia-smi's `-i` takes it
/// (`00000000:19:00.0`). CUDA numbers devices fastest first unless
/// `CUDA_DEVICE_ORDER` says otherwise, and within what `CUDA_VISIBLE_DEVICES`
/// leaves; nvidia-smi numbers every GPU of the host in PCI order. So only
/// the bus id names the same GPU for both.
pub fn pci_bus_id(ordinal: usize) -> Result<String, String> {
    use cudarc::driver::{result, sys::CUdevice_attribute as A};
    if !super::driver_present() {
        return Err("no CUDA driver to name the GPU".into());
    }
    let fail = |e: cudarc::driver::DriverError| format!("CUDA device {ordinal}: {e}");
    result::init().map_err(fail)?;
    let ordinal_c = i32::try_from(ordinal).map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
    let dev = result::device::get(ordinal_c).map_err(fail)?;
    let attribute = |a: A| {
        // SAFETY: `dev` came from `cuDeviceGet` just above, as the call requires.
        unsafe { result::device::get_attribute(dev, a) }.map_err(fail)
    };
    Ok(format_bus_id(
        attribute(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
        attribute(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
        attribute(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
    ))
}

/// `domain:bus:device.0` in hex, as nvidia-smi prints and accepts it.
fn format_bus_id(domain: i32, bus: i32, device: i32) -> String {
    format!("{domain:08X}:{bus:02X}:{device:02X}.0")
}

/// One `nvidia-smi` query of the GPU `id` names: its clocks and `reasons` field.
fn query(id: &str, reasons: &str) -> Result<ClockReading, String> {
    let out = Command::new("nvidia-smi")
        .args([
            "-i".to_string(),
            id.to_string(),
            format!("--query-gpu=clocks.sm,clocks.mem,{reasons}"),
            "--format=csv,noheader,nounits".to_string(),
        ])
        .output()
        .map_err(|e| format!("nvidia-smi not run: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.trim();
    parse_reading(line)
        .filter(|_| out.status.success())
        .ok_or_else(|| format!("nvidia-smi gave no clocks: {line:?}"))
}

/// The readings before and after one timed region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockWindow {
    pub before: Result<ClockReading, String>,
    pub after: Result<ClockReading, String>,
}

impl ClockWindow {
    /// Why the region's timing cannot be trusted: the throttling reasons
    /// active at either reading, or `None` (also when the clocks are
    /// unknown: not knowing is said in [`ClockWindow::describe`], not judged).
    pub fn throttled(&self) -> Option<String> {
        let seen = [&self.before, &self.after]
            .into_iter()
            .filter_map(|r| r.as_ref().ok())
            .fold(0, |all, r| all | r.reasons);
        (seen & THROTTLING != 0)
            .then(|| format!("GPU throttled: {}", reason_names(seen & THROTTLING)))
    }

    /// One line for the `clocks` column: `sm A->B MHz, mem C->D MHz,
    /// reasons X -> Y`, or `unknown (why)`.
    pub fn describe(&self) -> String {
        match (&self.before, &self.after) {
            (Ok(b), Ok(a)) => format!(
                "sm {}->{} MHz, mem {}->{} MHz, reasons {} -> {}",
                b.sm_mhz,
                a.sm_mhz,
                b.mem_mhz,
                a.mem_mhz,
                reason_names(b.reasons),
                reason_names(a.reasons)
            ),
            (Err(why), _) | (_, Err(why)) => format!("unknown ({why})"),
        }
    }
}

/// Runs `measure` between two readings of `read`; when the window is
/// throttled, runs it once more in a fresh window. Returns the last
/// measurement and its window (still throttled if the retry was too).
pub fn watched<T, E>(
    mut read: impl FnMut() -> Result<ClockReading, String>,
    mut measure: impl FnMut() -> Result<T, E>,
) -> Result<(T, ClockWindow), E> {
    let mut once = || -> Result<(T, ClockWindow), E> {
        let before = read();
        let m = measure()?;
        let after = read();
        Ok((m, ClockWindow { before, after }))
    };
    let first = once()?;
    if first.1.throttled().is_none() {
        return Ok(first);
    }
    once()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bus_id_is_written_as_nvidia_smi_prints_it() {
        assert_eq!(format_bus_id(0, 0x19, 0), "00000000:19:00.0");
        assert_eq!(format_bus_id(1, 0xb3, 0x1f), "00000001:B3:1F.0");
    }

    fn at(reasons: u64) -> Result<ClockReading, String> {
        Ok(ClockReading {
            sm_mhz: 1980,
            mem_mhz: 2619,
            reasons,
        })
    }

    #[test]
    fn nvidia_smi_lines_parse_and_others_do_not() {
        let r = parse_reading("1980, 2619, 0x0000000000000020").unwrap();
        assert_eq!((r.sm_mhz, r.mem_mhz, r.reasons), (1980, 2619, SW_THERMAL));
        assert_eq!(
            parse_reading("345, 1593, 0x0000000000000001")
                .unwrap()
                .reasons,
            GPU_IDLE
        );
        assert_eq!(parse_reading("[N/A], 2619, 0x0"), None);
        assert_eq!(parse_reading("1980, 2619, [Not Supported]"), None);
        assert_eq!(parse_reading("1980, 2619, 0x0, 7"), None);
        assert_eq!(parse_reading("No devices were found"), None);
    }

    #[test]
    fn thermal_and_hw_slowdowns_throttle_a_power_cap_or_idle_does_not() {
        for bit in [SW_THERMAL, HW_THERMAL, HW_SLOWDOWN, HW_POWER_BRAKE] {
            let w = ClockWindow {
                before: at(0),
                after: at(bit | SW_POWER_CAP),
            };
            let why = w.throttled().unwrap();
            assert!(why.starts_with("GPU throttled: "), "{why}");
            assert!(!why.contains("power cap"), "{why}");
        }
        let calm = ClockWindow {
            before: at(GPU_IDLE),
            after: at(SW_POWER_CAP | SYNC_BOOST),
        };
        assert_eq!(calm.throttled(), None);
        assert_eq!(
            calm.describe(),
            "sm 1980->1980 MHz, mem 2619->2619 MHz, reasons idle -> SW power cap, sync boost"
        );
        let hot_before = ClockWindow {
            before: at(HW_THERMAL),
            after: Err("gone".into()),
        };
        assert_eq!(
            hot_before.throttled().as_deref(),
            Some("GPU throttled: HW thermal slowdown")
        );
    }

    #[test]
    fn unknown_clocks_are_said_and_not_judged() {
        let w = ClockWindow {
            before: Err("nvidia-smi not run: not found".into()),
            after: at(0),
        };
        assert_eq!(w.throttled(), None);
        assert_eq!(w.describe(), "unknown (nvidia-smi not run: not found)");
        assert_eq!(reason_names(0), "none");
        assert_eq!(reason_names(0x1000 | GPU_IDLE), "idle, 0x1000");
    }

    #[test]
    fn a_throttled_window_is_measured_once_more() {
        // Canned readings: hot before the first run, then calm throughout.
        let mut readings = vec![at(SW_THERMAL), at(0), at(0), at(0)].into_iter();
        let mut runs = 0;
        let (m, w) = watched(
            || readings.next().unwrap_or_else(|| Err("none left".into())),
            || {
                runs += 1;
                Ok::<_, String>(runs)
            },
        )
        .unwrap();
        assert_eq!((m, runs), (2, 2));
        assert_eq!(w.throttled(), None);
        // Throttled twice: the second window is returned, still throttled.
        let mut hot = std::iter::repeat(at(HW_SLOWDOWN));
        let (m, w) = watched(|| hot.next().unwrap_or(at(0)), || Ok::<_, String>(7)).unwrap();
        assert_eq!(m, 7);
        assert!(w.throttled().is_some());
        // A calm first window is not repeated; an error is passed on.
        let mut n = 0;
        watched(
            || at(0),
            || {
                n += 1;
                Ok::<_, String>(())
            },
        )
        .unwrap();
        assert_eq!(n, 1);
        assert_eq!(
            watched(|| at(0), || Err::<(), _>("boom")).unwrap_err(),
            "boom"
        );
    }
}
