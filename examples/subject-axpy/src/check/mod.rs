//! The subject's check kinds, registered with `falsify_core::kinds!`:
//! `kernel_parity` (cuda: a kernel against the CPU oracle) and
//! `axpy_linearity` (cpu: a property of the oracle itself).

pub mod axpy_linearity;
pub mod kernel_parity;

use falsify_core::check::CPU;
use falsify_core::check::CUDA;

use crate::device::AxpyDevice;
use crate::error::{Error, Result};
use crate::Axpy;

falsify_core::kinds! {
    /// The `check:` block of one of the subject's falsification tests.
    pub enum AxpyKinds for Axpy {
        KernelParity(kernel_parity) "kernel_parity", CUDA,
            "rel-L2 error of an axpy or sum-of-squares kernel vs the f64 CPU oracle, every output element written";
        AxpyLinearity(axpy_linearity) "axpy_linearity", CPU,
            "the oracle's axpy is linear in a: axpy(a, x, axpy(b, x, y)) = axpy(a + b, x, y)";
    }
}

/// The device a `cuda` trial was handed.
fn device(device: Option<&mut AxpyDevice>) -> Result<&mut AxpyDevice> {
    device.ok_or_else(|| Error::CudaUnavailable("a cuda trial was handed no device".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use falsify_core::check::doc::example_yaml;
    use falsify_core::KindSet;

    /// Each kind's documented example is a check block the parser takes.
    #[test]
    fn every_example_parses() {
        for kind in AxpyKinds::KINDS {
            let yaml = example_yaml(kind, &[]);
            let parsed: AxpyKinds = serde_yaml::from_str(&yaml).unwrap();
            assert_eq!(parsed.kind_name(), kind.name, "{yaml}");
        }
    }

    /// Unknown keys and kinds are refused, with the line and the known names.
    #[test]
    fn strict_parsing_names_the_line_and_the_kinds() {
        let bad = "kind: kernel_parity\nop: axpy\nn: 8\nalpah: 2\n";
        let e = serde_yaml::from_str::<AxpyKinds>(bad).unwrap_err();
        assert!(e.to_string().contains("alpah"), "{e}");
        assert_eq!(e.location().map(|l| l.line()), Some(4));
        let e = serde_yaml::from_str::<AxpyKinds>("kind: gemm\n").unwrap_err();
        assert!(
            e.to_string().contains("kernel_parity, axpy_linearity"),
            "{e}"
        );
    }

    /// The reference `falsify kinds` would print names every parameter.
    #[test]
    fn the_reference_documents_every_parameter() {
        let md = falsify_core::subject::reference_markdown::<AxpyKinds>();
        for kind in AxpyKinds::KINDS {
            assert!(md.contains(kind.name));
            for p in kind.params {
                assert!(md.contains(p.name), "{} lacks {}", kind.name, p.name);
            }
        }
    }
}
