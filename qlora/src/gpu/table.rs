//! [`TensorTable`]: a list of device tensors described in device memory, so
//! that one kernel launch can cover them all (multi-tensor kernels: the
//! optimizer step and the gradient-norm reduction over every trainable tensor
//! of a step, instead of one launch per tensor).
//!
//! Layout, as the kernels read it (`n` tensors):
//!
//! ```text
//! ptrs     [columns * n]  u64: ptrs[c * n + i] = column c of tensor i (0 = absent)
//! offsets  [n + 1]        i64: offsets[i] = first index of tensor i in the
//!                               concatenation, offsets[n] = total elements
//! ```
//!
//! A table holds raw device addresses: it is only valid while the tensors it
//! was built from are alive and not reallocated. Its owner (the training step)
//! keeps both for the same lifetime and never replaces those buffers.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::GpuContext;
use crate::error::{Error, Result};

/// Tensors of equal lengths per row, `columns` pointers per tensor.
pub struct TensorTable {
    pub ptrs: CudaSlice<u64>,
    pub offsets: CudaSlice<i64>,
    /// Number of tensors (rows).
    pub tensors: usize,
    /// Pointers per tensor.
    pub columns: usize,
    /// Elements of all tensors together.
    pub total: usize,
}

/// The device address of `t` (an allocation or a view of one).
pub fn address<T>(gpu: &GpuContext, t: &impl DevicePtr<T>) -> u64 {
    // Event tracking is off on the context's stream (gpu/context.rs), so
    // the guard records nothing.
    let (ptr, _sync) = t.device_ptr(gpu.stream());
    ptr
}

impl TensorTable {
    /// A table of `lens.len()` tensors; `columns[c][i]` is the address of
    /// column `c` of tensor `i` (0 when that tensor has none, e.g. no scale).
    pub fn new(gpu: &GpuContext, columns: &[Vec<u64>], lens: &[usize]) -> Result<Self> {
        let n = lens.len();
        if n == 0 || columns.iter().any(|c| c.len() != n) {
            return Err(Error::ShapeMismatch {
                op: "tensor_table",
                expected: format!("at least one tensor and {n} pointers per column"),
                got: format!(
                    "column lengths {:?}",
                    columns.iter().map(Vec::len).collect::<Vec<_>>()
                ),
            });
        }
        let mut offsets = Vec::with_capacity(n + 1);
        let mut total = 0usize;
        offsets.push(0i64);
        for &len in lens {
            total += len;
            offsets.push(i64::try_from(total).map_err(|_| Error::InvalidArgument {
                op: "tensor_table",
                message: format!("{total} elements exceed the i64 index"),
            })?);
        }
        let flat: Vec<u64> = columns.iter().flatten().copied().collect();
        Ok(TensorTable {
            ptrs: gpu.upload(&flat)?,
            offsets: gpu.upload(&offsets)?,
            tensors: n,
            columns: columns.len(),
            total,
        })
    }
}
