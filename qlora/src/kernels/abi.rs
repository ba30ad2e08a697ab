//! The kernels' argument lists as the launchers push them, so a test can
//! check every launcher against the compiled PTX.

/// The PTX parameter class of a kernel argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// A device pointer (`.u64`).
    Ptr,
    /// `int` / `unsigned int` (`.u32`).
    I32,
    /// `long long` (`.u64`).
    I64,
    /// `float` (`.f32`).
    F32,
    /// `double` (`.f64`).
    F64,
}

impl Arg {
    /// The PTX `.param` type of this argument.
    pub fn ptx_type(self) -> &'static str {
        match self {
            Arg::Ptr | Arg::I64 => ".u64",
            Arg::I32 => ".u32",
            Arg::F32 => ".f32",
            Arg::F64 => ".f64",
        }
    }
}

/// One kernel's symbol and argument list.
pub type Signature = (&'static str, &'static [Arg]);

/// The argument list of every kernel of a module, by symbol.
pub type Signatures = &'static [Signature];

/// The `.param` types of kernel `symbol` in a PTX text, in order.
pub fn ptx_param_types(ptx: &str, symbol: &str) -> Option<Vec<String>> {
    let head = format!(".entry {symbol}(");
    let start = ptx.find(&head)? + head.len();
    let end = start + ptx[start..].find(')')?;
    Some(
        ptx[start..end]
            .split(',')
            .filter_map(|p| p.split_whitespace().nth(1).map(str::to_string))
            .collect(),
    )
}

/// Every module's launcher argument lists, by module name.
pub fn signatures() -> Vec<(&'static str, Signatures)> {
    use crate::ops::*;
    let mut all = vec![
        (rope::MODULE, rope::SIGNATURES),
        (rope::QKV_FWD_MODULE, rope::QKV_FWD_SIGNATURES),
        (rope::QKV_BWD_MODULE, rope::QKV_BWD_SIGNATURES),
        (rope::QKV_FWD_BF16_MODULE, rope::QKV_FWD_BF16_SIGNATURES),
        (rope::QKV_BWD_BF16_MODULE, rope::QKV_BWD_BF16_SIGNATURES),
        (softmax::MODULE, softmax::SIGNATURES),
        (elementwise::MODULE, elementwise::SIGNATURES),
        (adamw::MODULE, adamw::SIGNATURES),
        (faults::MODULE, faults::SIGNATURES),
        (gemm::MODULE, gemm::SIGNATURES),
        (nf4::MODULE, nf4::SIGNATURES),
        (cast::MODULE, cast::SIGNATURES),
        (draw::MODULE, draw::SIGNATURES),
        (
            crate::train::kernels::MODULE,
            crate::train::kernels::SIGNATURES,
        ),
    ];
    // The families split over several modules list theirs by module.
    all.extend_from_slice(embedding::SIGNATURES);
    all.extend_from_slice(cross_entropy::SIGNATURES);
    all.extend_from_slice(activation::SIGNATURES);
    all.extend_from_slice(clip::SIGNATURES);
    all.extend_from_slice(rmsnorm::SIGNATURES);
    all.extend_from_slice(attention::SIGNATURES);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels;

    /// Every kernel module has its launchers' argument lists.
    #[test]
    fn every_module_has_signatures() {
        let listed: Vec<&str> = signatures().iter().map(|(m, _)| *m).collect();
        for m in kernels::MODULES {
            assert!(listed.contains(&m.name), "{} has no signature list", m.name);
        }
    }

    #[test]
    fn every_declared_kernel_has_a_signature() {
        for (module, sigs) in signatures() {
            let Some(m) = kernels::module(module) else {
                panic!("no module {module}");
            };
            let mut declared: Vec<&str> = m.symbols.to_vec();
            let mut signed: Vec<&str> = sigs.iter().map(|s| s.0).collect();
            declared.sort_unstable();
            signed.sort_unstable();
            assert_eq!(declared, signed, "{module}");
        }
    }

    #[test]
    fn ptx_parameter_lists_are_read_in_order() {
        let ptx = ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .f32 k_param_1\n)\n{";
        assert_eq!(
            ptx_param_types(ptx, "k"),
            Some(vec![".u64".to_string(), ".f32".to_string()])
        );
    }
}
