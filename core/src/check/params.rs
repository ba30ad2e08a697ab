//! Validated parameter types any subject's kinds may use.
//!
//! Range checks happen while deserialising, so serde_yaml attaches the exact
//! line and column of the offending value to the error.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::Here;

/// A finite number `>= 0` (tolerances, bounds).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct NonNegative(pub f64);

/// A finite number `> 0` (ratios, learning rates, step sizes).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Positive(pub f64);

/// A fraction in `(0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Fraction(pub f64);

/// A count `> 0` (steps, repeats, cases), at most [`MAX_COUNT`]; each
/// kind states a tighter bound for each of its counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Count(pub usize);

/// The largest count any parameter parses as (2^40).
pub const MAX_COUNT: usize = 1 << 40;

/// A test's `timeout_s`: a finite number of seconds, at least
/// [`MIN_TIMEOUT_S`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Timeout(pub f64);

/// The shortest `timeout_s` a test may set, in seconds. Below it the start
/// of the trial's process (and, on a loaded machine, when it is scheduled)
/// decides whether the trial finishes in time, not the trial's own work,
/// so its verdict would be chance.
pub const MIN_TIMEOUT_S: f64 = 1.0;

/// [`MIN_TIMEOUT_S`] as the range check says it (a unit test keeps the two
/// in step).
const TIMEOUT_RULE: &str =
    ">= 1 (seconds; a shorter limit would time the start of the trial's process, not the trial)";

/// Deserialises a number and checks it inside the visitor, so serde_yaml marks
/// the error with the line and column of the value itself.
fn checked_f64<'de, D: Deserializer<'de>>(
    d: D,
    rule: &'static str,
    ok: fn(f64) -> bool,
) -> Result<f64, D::Error> {
    struct V {
        rule: &'static str,
        ok: fn(f64) -> bool,
    }
    impl de::Visitor<'_> for V {
        type Value = f64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a finite number that is {}", self.rule)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
            if !v.is_finite() {
                Err(E::custom(format!("{v} is not a finite number")))
            } else if !(self.ok)(v) {
                Err(E::custom(format!(
                    "{v} is out of range: it must be {}",
                    self.rule
                )))
            } else {
                Ok(v)
            }
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
            self.visit_f64(v as f64)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
            self.visit_f64(v as f64)
        }
    }
    d.deserialize_f64(V { rule, ok })
}

impl<'de> Deserialize<'de> for NonNegative {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_f64(d, ">= 0", |v| v >= 0.0).map(NonNegative)
    }
}

impl<'de> Deserialize<'de> for Positive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_f64(d, "> 0", |v| v > 0.0).map(Positive)
    }
}

impl<'de> Deserialize<'de> for Timeout {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_f64(d, TIMEOUT_RULE, |v| v >= MIN_TIMEOUT_S).map(Timeout)
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_f64(d, "in (0, 1]", |v| v > 0.0 && v <= 1.0).map(Fraction)
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number > 0")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                match usize::try_from(v) {
                    Ok(0) => Err(E::custom("0 is out of range: it must be > 0")),
                    Ok(n) if n <= MAX_COUNT => Ok(Count(n)),
                    _ => Err(E::custom(format!("{v} is too large"))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("{v} is out of range: it must be > 0")))
                    .and_then(|v| self.visit_u64(v))
            }
            /// A whole float (`1e6`) is the count it spells; the bound check
            /// is the integer one.
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Count, E> {
                if v.is_finite() && v.fract() == 0.0 && v > 0.0 && v <= MAX_COUNT as f64 {
                    self.visit_u64(v as u64)
                } else if v.is_finite() && v.fract() == 0.0 && v > 0.0 {
                    Err(E::custom(format!("{v} is too large")))
                } else {
                    Err(E::custom(format!("{v} is not a whole number > 0")))
                }
            }
        }
        // `any`, so that negative numbers reach `visit_i64` and get the range message.
        d.deserialize_any(V)
    }
}

/// Refuses `value` above the documented `bound` of parameter `name`.
pub fn at_most(name: &str, value: usize, bound: usize) -> Result<(), String> {
    if value > bound {
        Err(format!("{name}: {value} is above its bound of {bound}"))
    } else {
        Ok(())
    }
}

/// `bytes` in GiB, or MiB below one GiB, for messages.
pub fn gib(bytes: f64) -> String {
    let (gib, mib) = (f64::from(1u32 << 30), f64::from(1u32 << 20));
    if bytes >= gib {
        format!("{:.1} GiB", bytes / gib)
    } else {
        format!("{:.1} MiB", bytes / mib)
    }
}

/// Refuses a cpu trial whose estimated host memory `needed` (bytes) is more
/// than `here` has; `what` names the parameter and its value. A machine
/// whose memory is unknown (0) refuses nothing.
pub fn fits_host(what: &str, needed: f64, here: &Here) -> Result<(), String> {
    let have = here.host_memory_bytes as f64;
    if here.host_memory_bytes > 0 && needed > have {
        Err(format!(
            "{what} needs ~{} on cpu; this machine has {}",
            gib(needed),
            gib(have)
        ))
    } else {
        Ok(())
    }
}

/// Why a cuda trial needing `needed` device bytes cannot be judged on the
/// GPU of `here` (more than its free memory), or `None` when it fits or no
/// GPU is known.
pub fn gpu_shortfall(what: &str, needed: f64, here: &Here) -> Option<String> {
    let gpu = here.gpu.as_ref()?;
    let free = gpu.free_memory_bytes as f64;
    (needed > free).then(|| {
        format!(
            "{what} needs ~{}, {} has {} free",
            gib(needed),
            gpu.name,
            gib(free)
        )
    })
}

/// Named dimensions of one op invocation, e.g. `{rows: 4, hidden: 33}`.
/// Each op checks that it got exactly the dimensions it needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub BTreeMap<String, Count>);

impl Shape {
    /// The dimension `name`; callers validate the key set first with [`Shape::expect_dims`].
    pub fn dim(&self, name: &str) -> usize {
        self.0.get(name).map_or(0, |c| c.0)
    }

    /// The product of the named dimensions, in f64 so that no product of
    /// counts overflows (each is at most [`MAX_COUNT`]).
    pub fn product(&self, dims: &[&str]) -> f64 {
        dims.iter().map(|d| self.dim(d) as f64).product()
    }

    /// Checks that the shape names exactly `dims`; the error says what
    /// the op takes, e.g. "takes the dimensions [rows, hidden], not [rows,
    /// seq]".
    pub fn expect_dims(&self, dims: &[&str]) -> Result<(), String> {
        let got: Vec<&str> = self.0.keys().map(String::as_str).collect();
        let mut want: Vec<&str> = dims.to_vec();
        want.sort_unstable();
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "takes the dimensions [{}], not [{}]",
                dims.join(", "),
                got.join(", ")
            ))
        }
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={}", v.0)).collect();
        write!(f, "{{{}}}", parts.join(", "))
    }
}

/// Numeric precision of an op or GEMM path; picks the default tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    F32,
    Tf32,
    F16,
    Bf16,
}

impl Precision {
    /// Default relative-L2 tolerance against the f64-accumulated reference.
    pub fn default_tolerance(self) -> f64 {
        match self {
            Precision::F32 => 1e-5,
            Precision::Tf32 => 2e-3,
            Precision::F16 => 5e-3,
            Precision::Bf16 => 2e-2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_enforced_with_locations() {
        let e = serde_yaml::from_str::<NonNegative>("-1e-3").unwrap_err();
        assert!(e.to_string().contains(">= 0"), "{e}");
        assert!(e.location().is_some());
        assert!(serde_yaml::from_str::<NonNegative>(".nan").is_err());
        assert!(serde_yaml::from_str::<Positive>("0").is_err());
        assert!(serde_yaml::from_str::<Fraction>("1.5").is_err());
        assert!(serde_yaml::from_str::<Count>("0").is_err());
        assert_eq!(serde_yaml::from_str::<Count>("3").ok(), Some(Count(3)));
        let e = serde_yaml::from_str::<Timeout>("0.5").unwrap_err();
        assert!(e.to_string().contains("it must be >= 1 (seconds"), "{e}");
        assert!(TIMEOUT_RULE.starts_with(&format!(">= {MIN_TIMEOUT_S} ")));
        assert_eq!(
            serde_yaml::from_str::<Timeout>("1").ok(),
            Some(Timeout(MIN_TIMEOUT_S))
        );
    }

    #[test]
    fn whole_floats_are_counts_and_large_ones_are_refused() {
        assert_eq!(
            serde_yaml::from_str::<Count>("1e6").ok(),
            Some(Count(1_000_000))
        );
        let e = serde_yaml::from_str::<Count>("1.5").unwrap_err();
        assert!(e.to_string().contains("not a whole number"), "{e}");
        let e = serde_yaml::from_str::<Count>("1e20").unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        let e = serde_yaml::from_str::<Count>("2000000000000").unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn estimates_are_compared_with_what_is_here() {
        let ci = Here {
            host_memory_bytes: 24 * GIB,
            gpu: None,
        };
        let h100 = Here {
            host_memory_bytes: 128 * GIB,
            gpu: Some(crate::check::GpuHere {
                name: "NVIDIA H100 80GB HBM3".into(),
                total_memory_bytes: 80 * GIB,
                free_memory_bytes: 80 * GIB - GIB / 2,
                device_count: 1,
            }),
        };
        assert_eq!(at_most("steps", 10, 10), Ok(()));
        assert_eq!(
            at_most("steps", 11, 10).unwrap_err(),
            "steps: 11 is above its bound of 10"
        );
        let e = fits_host("steps: 5", 30.0 * GIB as f64, &ci).unwrap_err();
        assert_eq!(
            e,
            "steps: 5 needs ~30.0 GiB on cpu; this machine has 24.0 GiB"
        );
        assert!(fits_host("x", 20.0 * GIB as f64, &ci).is_ok());
        // Unknown memory refuses nothing.
        assert!(fits_host("x", 1e30, &Here::default()).is_ok());
        assert_eq!(gpu_shortfall("x", 79.0 * GIB as f64, &h100), None);
        assert_eq!(
            gpu_shortfall("x", 90.0 * GIB as f64, &h100).unwrap(),
            "x needs ~90.0 GiB, NVIDIA H100 80GB HBM3 has 79.5 GiB free"
        );
        assert_eq!(gpu_shortfall("x", 1e30, &ci), None);
    }
}
