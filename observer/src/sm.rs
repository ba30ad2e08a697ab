//! GPU architectures as NVIDIA numbers them (`sm_90`, `compute_75`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A compute capability, `major.minor`: the device's, or the one a piece of
/// code was built for.
///
/// NVIDIA writes it as one number, `10 * major + minor`, in names (`sm_90`,
/// `compute_120`), in cubin ELF flags and in fat-binary entries; 90 is 9.0,
/// 100 is 10.0, 121 is 12.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Sm {
    pub major: u32,
    pub minor: u32,
}

impl Sm {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// From NVIDIA's single number: `major = n / 10`, `minor = n % 10`.
    pub const fn from_number(number: u32) -> Self {
        Self {
            major: number / 10,
            minor: number % 10,
        }
    }

    /// NVIDIA's single number, `10 * major + minor`.
    pub const fn number(self) -> u32 {
        self.major * 10 + self.minor
    }

    /// The architecture named by `sm_XY`, `compute_XY` or `lto_XY`, with an
    /// optional feature suffix (`sm_90a`, `sm_100f`) that is ignored here.
    pub fn parse(name: &str) -> Option<Self> {
        let digits = ["sm_", "compute_", "lto_"]
            .iter()
            .find_map(|prefix| name.strip_prefix(prefix))?;
        let end = digits
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(digits.len());
        let suffix = &digits[end..];
        if end < 2 || !suffix.chars().all(|c| c.is_ascii_lowercase()) {
            return None;
        }
        digits[..end].parse().ok().map(Self::from_number)
    }

    /// An architecture older than `self` whose PTX the driver still JIT-compiles
    /// for it: `sm_70` for anything newer, else the oldest the driver knows.
    pub fn older(self) -> Self {
        let volta = Self::new(7, 0);
        if self > volta {
            volta
        } else {
            Self::new(5, 0)
        }
    }
}

impl From<(u32, u32)> for Sm {
    fn from((major, minor): (u32, u32)) -> Self {
        Self::new(major, minor)
    }
}

impl fmt::Display for Sm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.number())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_round_trip() {
        for (n, major, minor) in [(70, 7, 0), (90, 9, 0), (100, 10, 0), (121, 12, 1)] {
            let sm = Sm::from_number(n);
            assert_eq!((sm.major, sm.minor), (major, minor));
            assert_eq!(sm.number(), n);
            assert_eq!(Sm::parse(&sm.to_string()), Some(sm));
        }
        assert_eq!(Sm::from((9, 0)).to_string(), "sm_90");
    }

    #[test]
    fn names_with_prefixes_and_suffixes_parse() {
        assert_eq!(Sm::parse("compute_75"), Some(Sm::new(7, 5)));
        assert_eq!(Sm::parse("sm_90a"), Some(Sm::new(9, 0)));
        assert_eq!(Sm::parse("sm_100f"), Some(Sm::new(10, 0)));
        assert_eq!(Sm::parse("lto_89"), Some(Sm::new(8, 9)));
        for bad in ["sm90", "sm_", "sm_9", "sm_90A", "sm_90-x", "gfx90a", ""] {
            assert_eq!(Sm::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn older_is_strictly_older() {
        for device in [Sm::new(9, 0), Sm::new(8, 0), Sm::new(12, 1), Sm::new(7, 5)] {
            assert!(device.older() < device, "{device}");
        }
        assert_eq!(Sm::new(9, 0).older(), Sm::new(7, 0));
        assert_eq!(Sm::new(7, 0).older(), Sm::new(5, 0));
    }
}
