//! Launchers for `kernels/train.cu`: the one-launch AdamW over a tensor table
//! with the step number in device memory, the device step counter, and
//! in-place accumulation.

use cudarc::driver::{CudaSlice, CudaViewMut, PushKernelArg};

use crate::error::{Error, Result};
use crate::gpu::{to_i32, GpuContext, TensorTable};
use crate::kernels::abi::{Arg, Signatures};
use crate::ops::cast::Bf16;
use crate::train::AdamW;

pub const MODULE: &str = "train";

/// Kernel argument lists, checked against the compiled PTX by a unit test.
pub const SIGNATURES: Signatures = &[
    ("step_count_advance_i32", &[Arg::Ptr, Arg::I32]),
    ("accumulate_fwd_f32", &[Arg::Ptr, Arg::Ptr, Arg::I32]),
    (
        "accumulate_fwd_f32_bf16",
        &[Arg::Ptr, Arg::Ptr, Arg::Ptr, Arg::I32],
    ),
    (
        "adamw_multi_devt_f32",
        &[
            Arg::Ptr,
            Arg::Ptr,
            Arg::I32,
            Arg::Ptr,
            Arg::F32,
            Arg::F32,
            Arg::F32,
            Arg::F32,
            Arg::F32,
        ],
    ),
];

/// Columns of the optimizer's tensor table: parameter, gradient, first and
/// second moment, clip scale (0 = none).
pub const ADAMW_COLUMNS: usize = 5;

fn same_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op: "train",
            expected: format!("{what}: {want} elements"),
            got: format!("{got}"),
        })
    }
}

/// AdamW on every tensor of `table` (columns p, g, m, v, scale; see
/// [`ADAMW_COLUMNS`]) in one launch, each gradient multiplied by its clip
/// scale first when the tensor has one, with the step number `t = step[0]`
/// read on the device. `lr_sign` is `1` for descent (`-1` only for the
/// sign-flip fault).
pub fn adamw_table(
    gpu: &mut GpuContext,
    table: &TensorTable,
    step: &CudaSlice<i32>,
    hyper: &AdamW,
    lr_sign: f32,
) -> Result<()> {
    same_len("table columns", table.columns, ADAMW_COLUMNS)?;
    same_len("step", step.len(), 1)?;
    let n = to_i32("adamw", "tensors", table.tensors)?;
    let k = crate::ops::adamw::as_kernel_args(hyper);
    let lr = lr_sign * k.lr as f32;
    let (b1, b2, eps, wd) = (
        k.beta1 as f32,
        k.beta2 as f32,
        k.eps as f32,
        k.weight_decay as f32,
    );
    let f = gpu.function(MODULE, "adamw_multi_devt_f32")?;
    let cfg = gpu.launch_1d(table.total);
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(&table.ptrs).arg(&table.offsets).arg(&n).arg(step);
    l.arg(&lr).arg(&b1).arg(&b2).arg(&eps).arg(&wd);
    // SAFETY: adamw_multi_devt_f32(const unsigned long long* ptrs, const long
    // long* offsets, int n_tensors, const int* step, float lr, float beta1,
    // float beta2, float eps, float weight_decay): the table has 5 columns
    // of n_tensors addresses of live f32 buffers (the trainer that built it
    // owns them and never reallocates them) whose lengths are the offsets'
    // differences, or 0 in the scale column; p, m, v of one tensor are
    // distinct buffers, and no tensor appears twice; step holds one element.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `step[0] += by` on the device.
pub fn advance_step(gpu: &mut GpuContext, step: &mut CudaSlice<i32>, by: i32) -> Result<()> {
    same_len("step", step.len(), 1)?;
    let f = gpu.function(MODULE, "step_count_advance_i32")?;
    let cfg = crate::gpu::launch_config_1d(1, 1);
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(step).arg(&by);
    // SAFETY: step_count_advance_i32(int* step, int by): step holds one
    // element (checked above); only thread 0 of block 0 touches it.
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `y += x` element-wise.
pub fn accumulate(gpu: &mut GpuContext, y: &mut CudaSlice<f32>, x: &CudaSlice<f32>) -> Result<()> {
    same_len("x", x.len(), y.len())?;
    let n_i = crate::ops::launch::elements("accumulate", y.len())?;
    let f = gpu.function(MODULE, "accumulate_fwd_f32")?;
    let cfg = gpu.launch_1d(y.len());
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(y).arg(x).arg(&n_i);
    // SAFETY: accumulate_fwd_f32(float* y, const float* x, int n): both hold
    // n elements (checked above) and are distinct buffers (a mutable and a
    // shared borrow).
    unsafe { l.launch(cfg) }?;
    Ok(())
}

/// `y += x` element-wise, and `y16` = the sum rounded to bf16 (nearest,
/// ties to even): the bf16 step's residual gradient and the operand of the
/// input-gradient GEMM after it, in one pass.
pub fn accumulate_with_bf16(
    gpu: &mut GpuContext,
    y: &mut CudaSlice<f32>,
    x: &CudaSlice<f32>,
    y16: &mut CudaViewMut<'_, Bf16>,
) -> Result<()> {
    same_len("x", x.len(), y.len())?;
    same_len("y16", y16.len(), y.len())?;
    let n_i = crate::ops::launch::elements("accumulate", y.len())?;
    let f = gpu.function(MODULE, "accumulate_fwd_f32_bf16")?;
    let cfg = gpu.launch_1d(y.len());
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(y).arg(x).arg(y16).arg(&n_i);
    // SAFETY: accumulate_fwd_f32_bf16(float* y, const float* x, unsigned
    // short* y16, int n): all three hold n elements (checked above) and are
    // distinct buffers (two mutable borrows and a shared one).
    unsafe { l.launch(cfg) }?;
    Ok(())
}
