//! NF4 in the reference: the format and its f64 quantiser are the stack's
//! own host code ([`qlora::model::nf4`], exact in f64); the reference adds the
//! NF4 linear layer, dequantised and multiplied in f64.

pub use qlora::model::nf4::{
    dequantize, nearest_code, quantize, quantize_with, widest_gap, Nf4Tensor, BLOCK, CODE_BOOK,
    ZERO_CODE,
};

use crate::error::{Error, Result};

/// `y = x W^T` with `W [out_dim, in_dim]` stored as NF4: the reference simply
/// dequantises and multiplies in f64.
pub fn linear_nf4(
    x: &[f64],
    w: &Nf4Tensor,
    rows: usize,
    in_dim: usize,
    out_dim: usize,
) -> Result<Vec<f64>> {
    if w.len != in_dim * out_dim || w.codes.len() != w.len || w.absmax.len() * w.block != w.len {
        return Err(Error::ShapeMismatch {
            op: "nf4_linear",
            expected: format!("{out_dim} x {in_dim} = {} NF4 values", in_dim * out_dim),
            got: format!(
                "{} values, {} codes, {} blocks of {}",
                w.len,
                w.codes.len(),
                w.absmax.len(),
                w.block
            ),
        });
    }
    super::gemm::linear(x, &dequantize(w), rows, in_dim, out_dim)
}
