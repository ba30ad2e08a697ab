//! `gradient_check` execution: analytic backward vs central finite differences.
//!
//! For an op `f` with inputs `x_1..x_k`, a seeded random upstream gradient `dy`
//! defines the scalar `L = <dy, f(x)>`. The analytic gradient `g = f'(x)^T dy`
//! comes from the op's `backward`; the numerical one is
//! `g_fd_i = (L(x + h e_i) - L(x - h e_i)) / 2h`, all in f64. Each input is
//! scored by `||g - g_fd|| / ||g_fd||` over its probed coordinates; the
//! headline is the worst input over all shapes.

use rand::seq::index;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Params;
use crate::check::op::Op;
use crate::check::params::Shape;
use crate::check::stats::Worst;
use crate::check::{Comparator, Measurement, TrialContext};
use crate::error::{Error, Result};
use crate::mutant::{reference_ops as faulty, Mutant};
use crate::reference::attention::{self, AttnShape};
use crate::reference::{
    activation, cross_entropy, elementwise, embedding, gemm, rmsnorm, rope, softmax,
};

/// At most this many coordinates of one input are probed (chosen by the seeded RNG).
pub(super) const MAX_PROBES: usize = 2000;
/// RMSNorm epsilon of the model presets.
const RMSNORM_EPS: f64 = 1e-6;
/// RoPE base for the check: small enough that every pair of a small head turns visibly.
const ROPE_THETA: f64 = 10_000.0;

pub fn measure(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    match (&p.op, &p.model) {
        (Some(_), _) => measure_op(p, cx),
        (None, Some(_)) => super::model::measure(p, cx),
        (None, None) => Err(Error::InvalidArgument {
            op: "gradient_check",
            message: "give `op` or `model`".into(),
        }),
    }
}

type Forward = Box<dyn Fn(&[Vec<f64>]) -> Result<Vec<f64>>>;
type Backward = Box<dyn Fn(&[Vec<f64>], &[f64]) -> Result<Vec<Vec<f64>>>>;

/// One differentiable instance: named inputs, the forward and the analytic
/// backward (which returns one gradient per input, in order).
pub struct Problem {
    names: Vec<&'static str>,
    inputs: Vec<Vec<f64>>,
    forward: Forward,
    backward: Backward,
}

fn uniform(rng: &mut ChaCha8Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn three<T>(v: (T, T, T)) -> Vec<T> {
    vec![v.0, v.1, v.2]
}

/// Builds the seeded instance of `op` at `shape` from the op table;
/// `mutant` swaps in the faulty backward when it is the op's own.
fn problem(op: Op, shape: &Shape, rng: &mut ChaCha8Rng, mutant: Option<Mutant>) -> Result<Problem> {
    let refuse = |message: String| Error::InvalidArgument {
        op: "gradient_check",
        message,
    };
    if !op.has_backward() {
        return Err(refuse(format!("op `{op}` has no backward pass to check")));
    }
    let g = op.spec().gradient.as_ref().ok_or_else(|| {
        refuse(format!(
            "{op} has no CPU reference backward here; its backward is checked on the GPU \
             (op_parity) and through the training step"
        ))
    })?;
    Ok((g.problem)(shape, rng, mutant == Some(g.mutant)))
}

/// The instance of `embedding`; `overwrite` swaps in the faulty backward
/// (`EmbeddingBackwardOverwrites`).
pub(crate) fn embedding_problem(shape: &Shape, rng: &mut ChaCha8Rng, overwrite: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let (vocab, hidden, n) = (d("vocab"), d("hidden"), d("tokens"));
    let mut tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab as u32)).collect();
    // At least one repeated token, so accumulation is exercised.
    if n >= 2 {
        tokens[n - 1] = tokens[0];
    }
    let tk = tokens.clone();
    Problem {
        names: vec!["table"],
        inputs: vec![uniform(rng, vocab * hidden, -1.0, 1.0)],
        forward: Box::new(move |x| embedding::forward(&x[0], vocab, hidden, &tokens)),
        backward: Box::new(move |_, dy| {
            let g = if overwrite {
                faulty::embedding_backward_overwrites(dy, vocab, hidden, &tk)?
            } else {
                embedding::backward(dy, vocab, hidden, &tk)?
            };
            Ok(vec![g])
        }),
    }
}

/// The instance of `rmsnorm`; `faulty_bwd` swaps in the faulty backward
/// (`RmsnormBackwardMissingProjection`).
pub(crate) fn rmsnorm_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let (rows, hidden) = (d("rows"), d("hidden"));
    Problem {
        names: vec!["x", "gamma"],
        inputs: vec![
            uniform(rng, rows * hidden, -1.0, 1.0),
            uniform(rng, hidden, 0.5, 1.5),
        ],
        forward: Box::new(move |x| rmsnorm::forward(&x[0], &x[1], rows, hidden, RMSNORM_EPS)),
        backward: Box::new(move |x, dy| {
            let (dx, dg) = if faulty_bwd {
                faulty::rmsnorm_backward_missing_projection(
                    &x[0],
                    &x[1],
                    dy,
                    rows,
                    hidden,
                    RMSNORM_EPS,
                )?
            } else {
                rmsnorm::backward(&x[0], &x[1], dy, rows, hidden, RMSNORM_EPS)?
            };
            Ok(vec![dx, dg])
        }),
    }
}

/// The instance of `rope`; `faulty_bwd` swaps in the faulty backward
/// (`RopeBackwardForwardRotation`).
pub(crate) fn rope_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let (b, s, h, hd) = (d("batch"), d("seq"), d("heads"), d("head_dim"));
    Problem {
        names: vec!["x"],
        inputs: vec![uniform(rng, b * s * h * hd, -1.0, 1.0)],
        forward: Box::new(move |x| rope::forward(&x[0], b, s, h, hd, ROPE_THETA)),
        backward: Box::new(move |_, dy| {
            let g = if faulty_bwd {
                faulty::rope_backward_forward_rotation(dy, b, s, h, hd, ROPE_THETA)?
            } else {
                rope::backward(dy, b, s, h, hd, ROPE_THETA)?
            };
            Ok(vec![g])
        }),
    }
}

/// The instance of `rope_qkv`; `faulty_bwd` swaps in the faulty backward
/// (`RopeBackwardForwardRotation`).
pub(crate) fn rope_qkv_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let dims = rope::QkvDims {
        batch: d("batch"),
        seq: d("seq"),
        heads: d("heads"),
        kv_heads: d("kv_heads"),
        head_dim: d("head_dim"),
        rank: d("rank"),
        scale: 2.0,
    };
    // Bq and Bv are held fixed: the step takes their gradients with
    // GEMMs, not through this epilogue.
    let bq = uniform(rng, dims.heads * dims.head_dim * dims.rank, -0.5, 0.5);
    let bv = uniform(rng, dims.kv_heads * dims.head_dim * dims.rank, -0.5, 0.5);
    // A frozen bias only shifts the epilogue: its gradient in y is the same.
    let bias = uniform(
        rng,
        dims.heads * dims.head_dim + 2 * dims.kv_heads * dims.head_dim,
        -0.5,
        0.5,
    );
    let (bq2, bv2) = (bq.clone(), bv.clone());
    let backward = if faulty_bwd {
        faulty::rope_qkv_backward_forward_rotation
    } else {
        rope::qkv_backward
    };
    Problem {
        names: vec!["y"],
        inputs: vec![uniform(
            rng,
            dims.batch * dims.seq * dims.width(),
            -1.0,
            1.0,
        )],
        forward: Box::new(move |x| rope::qkv_forward((&x[0], &bias), &bq, &bv, &dims, ROPE_THETA)),
        backward: Box::new(move |_, dy| Ok(vec![backward(dy, &bq2, &bv2, &dims, ROPE_THETA)?])),
    }
}

/// The instance of `softmax`; `faulty_bwd` swaps in the faulty backward
/// (`SoftmaxBackwardMissingDot`).
pub(crate) fn softmax_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let (rows, seq) = (d("rows"), d("seq"));
    Problem {
        names: vec!["x"],
        inputs: vec![uniform(rng, rows * seq, -2.0, 2.0)],
        forward: Box::new(move |x| softmax::forward(&x[0], rows, seq)),
        backward: Box::new(move |x, dy| {
            let y = softmax::forward(&x[0], rows, seq)?;
            let g = if faulty_bwd {
                faulty::softmax_backward_missing_dot(&y, dy, rows, seq)?
            } else {
                softmax::backward(&y, dy, rows, seq)?
            };
            Ok(vec![g])
        }),
    }
}

/// The instance of `attention`; `faulty_bwd` swaps in the faulty backward
/// (`AttentionBackwardUnscaled`).
pub(crate) fn attention_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let sh = AttnShape {
        batch: d("batch"),
        seq: d("seq"),
        heads: d("heads"),
        kv_heads: d("kv_heads"),
        head_dim: d("head_dim"),
    };
    let q_len = sh.batch * sh.seq * sh.heads * sh.head_dim;
    let kv_len = sh.batch * sh.seq * sh.kv_heads * sh.head_dim;
    Problem {
        names: vec!["q", "k", "v"],
        inputs: vec![
            uniform(rng, q_len, -1.5, 1.5),
            uniform(rng, kv_len, -1.5, 1.5),
            uniform(rng, kv_len, -1.0, 1.0),
        ],
        forward: Box::new(move |x| Ok(attention::forward(&x[0], &x[1], &x[2], &sh)?.0)),
        backward: Box::new(move |x, dy| {
            let (_, probs) = attention::forward(&x[0], &x[1], &x[2], &sh)?;
            let g = if faulty_bwd {
                faulty::attention_backward_unscaled(&x[0], &x[1], &x[2], &probs, dy, &sh)?
            } else {
                attention::backward(&x[0], &x[1], &x[2], &probs, dy, &sh)?
            };
            Ok(three(g))
        }),
    }
}

/// The instance of `silu`; `faulty_bwd` swaps in the faulty backward
/// (`SwigluBackwardMissingSiluDerivative`).
pub(crate) fn silu_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let n = d("rows") * d("cols");
    Problem {
        names: vec!["x"],
        inputs: vec![uniform(rng, n, -4.0, 4.0)],
        forward: Box::new(|x| Ok(activation::silu_forward(&x[0]))),
        backward: Box::new(move |x, dy| {
            let g = if faulty_bwd {
                faulty::silu_backward_missing_derivative(&x[0], dy)?
            } else {
                activation::silu_backward(&x[0], dy)?
            };
            Ok(vec![g])
        }),
    }
}

/// The instance of `swiglu`; `faulty_bwd` swaps in the faulty backward
/// (`SwigluBackwardMissingSiluDerivative`).
pub(crate) fn swiglu_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let n = d("rows") * d("cols");
    Problem {
        names: vec!["gate", "up"],
        inputs: vec![uniform(rng, n, -4.0, 4.0), uniform(rng, n, -1.0, 1.0)],
        forward: Box::new(|x| activation::swiglu_forward(&x[0], &x[1])),
        backward: Box::new(move |x, dy| {
            let (dg, du) = if faulty_bwd {
                faulty::swiglu_backward_missing_silu_derivative(&x[0], &x[1], dy)?
            } else {
                activation::swiglu_backward(&x[0], &x[1], dy)?
            };
            Ok(vec![dg, du])
        }),
    }
}

/// The instance of `residual_add`; `faulty_bwd` swaps in the faulty backward
/// (`ResidualBackwardDropsSkip`).
pub(crate) fn residual_add_problem(
    shape: &Shape,
    rng: &mut ChaCha8Rng,
    faulty_bwd: bool,
) -> Problem {
    let d = |name: &str| shape.dim(name);
    let n = d("rows") * d("cols");
    Problem {
        names: vec!["a (skip)", "b (branch)"],
        inputs: vec![uniform(rng, n, -1.0, 1.0), uniform(rng, n, -1.0, 1.0)],
        forward: Box::new(|x| elementwise::residual_add(&x[0], &x[1])),
        backward: Box::new(move |_, dy| {
            let (da, db) = if faulty_bwd {
                faulty::residual_backward_drops_skip(dy)
            } else {
                elementwise::residual_add_backward(dy)
            };
            Ok(vec![da, db])
        }),
    }
}

/// The instance of `scale`; `faulty_bwd` swaps in the faulty backward
/// (`ScaleBackwardIgnoresScale`).
pub(crate) fn scale_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let n = d("rows") * d("cols");
    // Kept away from 1 so a backward that ignores the scale shows.
    let s = rng.random_range(0.1..0.9);
    Problem {
        names: vec!["x"],
        inputs: vec![uniform(rng, n, -1.0, 1.0)],
        forward: Box::new(move |x| Ok(elementwise::scale(&x[0], s))),
        backward: Box::new(move |_, dy| {
            let g = if faulty_bwd {
                faulty::scale_backward_ignores_scale(dy, s)
            } else {
                elementwise::scale_backward(dy, s)
            };
            Ok(vec![g])
        }),
    }
}

/// The instance of `cross_entropy`; `faulty_bwd` swaps in the faulty backward
/// (`CrossEntropyGradMissingSoftmax`).
pub(crate) fn cross_entropy_problem(
    shape: &Shape,
    rng: &mut ChaCha8Rng,
    faulty_bwd: bool,
) -> Problem {
    let d = |name: &str| shape.dim(name);
    let (rows, vocab) = (d("rows"), d("vocab"));
    let targets: Vec<u32> = (0..rows)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    let tg = targets.clone();
    Problem {
        names: vec!["logits"],
        inputs: vec![uniform(rng, rows * vocab, -3.0, 3.0)],
        forward: Box::new(move |x| Ok(vec![cross_entropy::forward(&x[0], rows, vocab, &targets)?])),
        backward: Box::new(move |x, dy| {
            let g = if faulty_bwd {
                faulty::cross_entropy_grad_missing_softmax(&x[0], rows, vocab, &tg)?
            } else {
                cross_entropy::backward(&x[0], rows, vocab, &tg)?
            };
            // The loss is a scalar: L = dy_0 * loss.
            let s = dy.first().copied().unwrap_or(0.0);
            Ok(vec![g.iter().map(|v| v * s).collect()])
        }),
    }
}

/// The instance of `gemm`; `faulty_bwd` swaps in the faulty backward
/// (`GemmBackwardUntransposed`).
pub(crate) fn gemm_problem(shape: &Shape, rng: &mut ChaCha8Rng, faulty_bwd: bool) -> Problem {
    let d = |name: &str| shape.dim(name);
    let (m, n, k) = (d("m"), d("n"), d("k"));
    Problem {
        names: vec!["a", "b"],
        inputs: vec![
            uniform(rng, m * k, -1.0, 1.0),
            uniform(rng, k * n, -1.0, 1.0),
        ],
        forward: Box::new(move |x| gemm::matmul(&x[0], &x[1], m, n, k)),
        backward: Box::new(move |x, dc| {
            let (da, db) = if faulty_bwd {
                faulty::gemm_backward_untransposed(&x[0], &x[1], dc, m, n, k)?
            } else {
                gemm::backward(&x[0], &x[1], dc, m, n, k)?
            };
            Ok(vec![da, db])
        }),
    }
}

/// Relative error of the analytic gradient of each input of `p` (in order),
/// with the number of coordinates probed.
fn rel_errors(p: &Problem, rng: &mut ChaCha8Rng, h: f64) -> Result<Vec<(f64, usize)>> {
    let y = (p.forward)(&p.inputs)?;
    let dy = uniform(rng, y.len(), -1.0, 1.0);
    let grads = (p.backward)(&p.inputs, &dy)?;
    if grads.len() != p.inputs.len() {
        return Err(Error::InvalidArgument {
            op: "gradient_check",
            message: format!(
                "backward gave {} gradients for {} inputs",
                grads.len(),
                p.inputs.len()
            ),
        });
    }
    let loss = |xs: &[Vec<f64>]| -> Result<f64> { Ok(dot(&dy, &(p.forward)(xs)?)) };
    let mut xs = p.inputs.clone();
    let mut out = Vec::with_capacity(p.inputs.len());
    for (which, g) in grads.iter().enumerate() {
        let len = p.inputs[which].len();
        if g.len() != len {
            return Err(Error::ShapeMismatch {
                op: "gradient_check",
                expected: format!("gradient of `{}` with {len} elements", p.names[which]),
                got: format!("{} elements", g.len()),
            });
        }
        let mut probes: Vec<usize> = if len <= MAX_PROBES {
            (0..len).collect()
        } else {
            index::sample(rng, len, MAX_PROBES).into_vec()
        };
        probes.sort_unstable();
        let mut diff_sq = 0.0;
        let mut fd_sq = 0.0;
        for &i in &probes {
            let x0 = xs[which][i];
            xs[which][i] = x0 + h;
            let plus = loss(&xs)?;
            xs[which][i] = x0 - h;
            let minus = loss(&xs)?;
            xs[which][i] = x0;
            let fd = (plus - minus) / (2.0 * h);
            diff_sq += (g[i] - fd).powi(2);
            fd_sq += fd * fd;
        }
        let rel = diff_sq.sqrt() / fd_sq.sqrt().max(f64::MIN_POSITIVE);
        out.push((rel, probes.len()));
    }
    Ok(out)
}

fn measure_op(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let Some(op) = p.op else {
        return Err(Error::InvalidArgument {
            op: "gradient_check",
            message: "give `op`".into(),
        });
    };
    let h = p.step.0;
    let mut rng = ChaCha8Rng::seed_from_u64(cx.seed);
    let mut worst = Worst::default();
    for shape in &p.shapes {
        let prob = problem(op, shape, &mut rng, cx.mutant)?;
        for (which, (rel, probed)) in rel_errors(&prob, &mut rng, h)?.into_iter().enumerate() {
            let total = prob.inputs[which].len();
            worst.offer(rel, || {
                format!(
                    "shape {shape}, input `{}` ({probed} of {total} coordinates probed)",
                    prob.names[which]
                )
            });
        }
    }
    let detail = format!(
        "op {op}: worst rel error {:.3e} at {}; {} shape(s), h = {h:e}",
        worst.value(),
        worst.what(),
        p.shapes.len()
    );
    Ok(Measurement::new(
        "grad_rel_error",
        worst.value(),
        Comparator::Le,
        p.tolerance.0,
        "ratio",
    )
    .with_detail(detail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{Backend, CheckSpec, KindSet};
    use falsify_core::contract::ContractOf;
    use falsify_core::core_kinds::Check;

    /// Every CPU test of this module's contracts holds for many seeds, and its
    /// mutant is caught for every one of them (not just for the harness's seed).
    #[test]
    fn contracts_hold_and_mutants_fail_across_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts");
        for file in [
            "reference-gradients-v1",
            "reference-properties-v1",
            "softmax-properties-v1",
        ] {
            let text = std::fs::read_to_string(dir.join(format!("{file}.yaml"))).unwrap();
            let contract: ContractOf<crate::Qlora> = serde_yaml::from_str(&text).unwrap();
            for test in &contract.falsification_tests {
                let check = match &test.check {
                    Check::Subject(
                        check @ (CheckSpec::GradientCheck(_) | CheckSpec::Property(_)),
                    ) => check,
                    other => panic!("{}: {other:?}", test.id),
                };
                for seed in 0..12u64 {
                    for mutant in [None, test.mutant.subject().copied()] {
                        let mut cx = TrialContext {
                            seed: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                            mutant,
                            device: None,
                        };
                        let m = check.execute(Backend::Cpu, &mut cx).unwrap();
                        assert_eq!(
                            m.passed(),
                            mutant.is_none(),
                            "{}::{} seed {seed} mutant {mutant:?}: {} = {:e} ({})",
                            file,
                            test.id,
                            m.metric,
                            m.observed,
                            m.detail
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn worst_keeps_non_finite_values() {
        let mut w = Worst::default();
        w.offer(1.0, || "a".into());
        w.offer(f64::NAN, || "b".into());
        w.offer(5.0, || "c".into());
        assert!(w.value().is_nan());
        assert_eq!(w.what(), "b");
    }
}
