//! CPU reference benchmarks: the oracle's own cost, so the contract suite's
//! run time stays predictable. Throughput is declared in FLOPs (as elements of
//! work) for the GEMM and in bytes for the memory-bound RMSNorm.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use falsify_qlora::reference::{gemm, rmsnorm};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn bench_gemm(c: &mut Criterion) {
    let mut group = c.benchmark_group("reference_gemm");
    for &(m, n, k) in &[(64, 64, 64), (128, 256, 64), (256, 896, 128)] {
        let a = random(m * k, 1);
        let b = random(k * n, 2);
        group.throughput(Throughput::Elements((2 * m * n * k) as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{m}x{n}x{k}")),
            &(m, n, k),
            |bench, &(m, n, k)| bench.iter(|| gemm::matmul(&a, &b, m, n, k)),
        );
    }
    group.finish();
}

fn bench_rmsnorm(c: &mut Criterion) {
    let mut group = c.benchmark_group("reference_rmsnorm");
    for &(rows, hidden) in &[(32, 64), (256, 896)] {
        let x = random(rows * hidden, 3);
        let gamma = random(hidden, 4);
        // Read x and gamma, write y: 8 bytes per f64 element.
        group.throughput(Throughput::Bytes((8 * (2 * rows * hidden + hidden)) as u64));
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("{rows}x{hidden}")),
            &(rows, hidden),
            |bench, &(rows, hidden)| {
                bench.iter(|| rmsnorm::forward(&x, &gamma, rows, hidden, 1e-6))
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_gemm, bench_rmsnorm);
criterion_main!(benches);
