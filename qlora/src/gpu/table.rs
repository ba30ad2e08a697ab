//! [`TensorTable`]: a list of device tensors described in device memory, so
//! that one kernel launch can cover them all (multi-tensor kernels: the
//! optimizer step and the gradient-norm reduction over every trainable tensor
//! of a step, instead of one launch per tensor).
//!
//! Layout, as the kernels read it (`n` tensors):
//!
//! ```text
//! ptrs     [columns * n]  u64: ptrs[c * n + i] = column c of tensor i (0 = absent)
//! offsets  [n + 1 + b]    i64: offsets[i] = first index of tensor i in the
//!                               concatenation, offsets[n] = total elements;
//!                               then offsets[n + 1 + j] = the tensor that
//!                               holds element j * TABLE_BUCKET
//! ```
//!
//! The bucket index after the offsets lets a kernel find an element's tensor
//! with one load and a step or two forward (`table_find` in common.cuh)
//! instead of a binary search over every tensor: a chain of dependent loads
//! per element, which measured most of the multi-tensor kernels' time.
//!
//! A table holds raw device addresses: it is only valid while the tensors it
//! was built from are alive and not reallocated. Its owner (the training step)
//! keeps both for the same lifetime and never replaces those buffers.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::GpuContext;
use crate::error::{Error, Result};

/// Elements per bucket of a table's bucket index (`TABLE_BUCKET_SHIFT` in
/// common.cuh is its log2).
pub const TABLE_BUCKET: usize = 1024;

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
        offsets.extend(bucket_index(&offsets, total)?);
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

/// For each bucket `j` of [`TABLE_BUCKET`] elements of the concatenation,
/// the tensor that holds element `j * TABLE_BUCKET`: the largest `i` with
/// `offsets[i] <= j * TABLE_BUCKET` (`offsets` has `n + 1` entries, the last
/// the total).
fn bucket_index(offsets: &[i64], total: usize) -> Result<Vec<i64>> {
    let n = offsets.len().saturating_sub(1);
    let mut index = Vec::with_capacity(total.div_ceil(TABLE_BUCKET));
    let mut i = 0usize;
    for start in (0..total).step_by(TABLE_BUCKET) {
        let start = i64::try_from(start).map_err(|_| Error::InvalidArgument {
            op: "tensor_table",
            message: format!("{total} elements exceed the i64 index"),
        })?;
        while i + 1 < n && offsets[i + 1] <= start {
            i += 1;
        }
        index.push(i as i64);
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bucket_names_the_tensor_of_its_first_element() {
        // Tensors of 1,500, 0, 600 and 2,000 elements: buckets start at 0,
        // 1,024 (tensor 0), 2,048 (tensor 2 ends at 2,100) and 3,072 (3).
        let offsets = [0, 1500, 1500, 2100, 4100];
        assert_eq!(bucket_index(&offsets, 4100).unwrap(), vec![0, 0, 2, 3, 3]);
        // A bucket starting where an empty tensor sits takes the tensor after it.
        let offsets = [0, 1024, 1024, 3000];
        assert_eq!(bucket_index(&offsets, 3000).unwrap(), vec![0, 2, 2]);
    }

    #[test]
    fn the_bucket_is_the_kernels() {
        let source = include_str!("../kernels/common.cuh");
        let shift = crate::kernels::cu_define(source, "TABLE_BUCKET_SHIFT");
        assert_eq!(shift.map(|s| 1usize << s), Some(TABLE_BUCKET));
    }
}
