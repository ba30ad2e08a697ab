//! Fault knobs are scoped: whatever happens inside `GpuContext::with_faults`,
//! a panic included, the knobs are off once the scope is gone, and the next
//! launch on the same context runs clean.
//!
//! Needs a GPU: run on the GPU machine with `fault_scope --ignored`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use qlora::gpu::{driver_present, GpuContext, GpuOptions};
use qlora::ops::elementwise;
use qlora::Faults;

/// `y = 2 x` over `n` elements on `gpu`, from a poisoned `y`; returns `y`.
fn scale_by_two(gpu: &mut GpuContext, n: usize) -> Vec<f32> {
    let x = gpu.upload(&vec![1.5f32; n]).expect("upload x");
    let mut y = gpu.poisoned(n).expect("poisoned y");
    elementwise::scale(gpu, &x.as_view(), 2.0, &mut y.as_view_mut()).expect("scale");
    gpu.download(&y).expect("download y")
}

#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn a_panic_inside_a_fault_scope_leaves_the_next_launch_clean() {
    assert!(driver_present(), "no CUDA driver");
    let mut gpu = GpuContext::new(GpuOptions::default()).expect("open the GPU");
    let faults = Faults {
        last_element_unwritten: true,
        ..Faults::NONE
    };
    let n = 1000;
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let mut scope = gpu.with_faults(faults);
        let faulty = scale_by_two(&mut scope, n);
        // The knob acts inside the scope: the last element keeps its poison.
        assert!(faulty[n - 1].is_nan(), "the fault did not act");
        assert!(faulty[..n - 1].iter().all(|&v| v == 3.0));
        panic!("a check panics with the fault on");
    }));
    assert!(panicked.is_err(), "the closure must have panicked");
    assert_eq!(gpu.faults(), Faults::NONE, "the guard cleared the knobs");
    let clean = scale_by_two(&mut gpu, n);
    assert!(clean.iter().all(|&v| v == 3.0), "every element written");
}
