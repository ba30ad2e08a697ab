//! Launch helpers shared by the launchers: length checks, element-count
//! limits and the launch shapes of row and float4 kernels.

use cudarc::driver::LaunchConfig;

use crate::error::{Error, Result};
use crate::gpu::GpuContext;

/// Checks that a buffer of `got` elements holds `prod(dims)` of them.
pub fn expect_len(op: &'static str, what: &str, got: usize, dims: &[usize]) -> Result<()> {
    let expected: usize = dims.iter().product();
    if got == expected {
        Ok(())
    } else {
        let dims_text: Vec<String> = dims.iter().map(usize::to_string).collect();
        Err(Error::ShapeMismatch {
            op,
            expected: format!("{what}: [{}] = {expected} elements", dims_text.join(", ")),
            got: format!("{got} elements"),
        })
    }
}

/// Threads per block of a row kernel over `cols` columns: a multiple of 32,
/// at least 32, at most `max`.
pub fn row_threads(cols: usize, max: u32) -> u32 {
    let want = cols.div_ceil(32).saturating_mul(32).max(32);
    u32::try_from(want).unwrap_or(max).min(max)
}

/// Largest element count of a grid-stride kernel: with `n <= 2^30` and a grid
/// of at most `2^30` threads, `k + stride` never overflows the kernel's `int`.
pub const MAX_ELEMENTS: usize = 1 << 30;

/// A float4 kernel's launch over `n` elements: the count it writes (fewer
/// only under the "last element unwritten" fault) as its `int n`, and one
/// thread per four elements; `None` when nothing is to be written.
pub fn vec4_launch(
    gpu: &GpuContext,
    op: &'static str,
    n: usize,
) -> Result<Option<(i32, LaunchConfig)>> {
    match gpu.faults().written(n) {
        0 => Ok(None),
        w => Ok(Some((elements(op, w)?, gpu.launch_1d(w.div_ceil(4))))),
    }
}

/// `n` as the kernel's `int` element count, or an error above [`MAX_ELEMENTS`].
pub fn elements(op: &'static str, n: usize) -> Result<i32> {
    if n > MAX_ELEMENTS {
        return Err(Error::InvalidArgument {
            op,
            message: format!("{n} elements exceed the kernel limit of {MAX_ELEMENTS}"),
        });
    }
    crate::gpu::to_i32(op, "elements", n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_threads_are_whole_warps_within_the_cap() {
        assert_eq!(row_threads(1, 256), 32);
        assert_eq!(row_threads(33, 256), 64);
        assert_eq!(row_threads(151_936, 1024), 1024);
    }

    #[test]
    fn lengths_and_element_limits_are_refused_by_name() {
        assert!(expect_len("op", "x", 6, &[2, 3]).is_ok());
        let e = expect_len("op", "x", 5, &[2, 3]).unwrap_err().to_string();
        assert!(
            e.contains("[2, 3] = 6 elements") && e.contains("5 elements"),
            "{e}"
        );
        assert!(elements("op", MAX_ELEMENTS + 1).is_err());
        assert_eq!(elements("op", 7).ok(), Some(7));
    }
}
