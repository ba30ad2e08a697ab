//! Deterministic training samples of one fixed shape.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::Resolved;

/// One instruction sample: `prompt.len() + response.len()` is exactly the
/// setup's `seq_len`, every step. Another length would re-size buffers
/// (T:finetune/instruct_pipeline/cuda_forward.rs:81-90), miss pre-warm keys,
/// re-upload the causal mask inside the forward capture and capture a new
/// graph per length (cuda_forward.rs:106).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
}

impl Sample {
    /// Response tokens the loss covers: the window is
    /// `[prompt_len - 1, seq_len - 1)` (T:finetune/instruct_pipeline/training.rs:624-636).
    pub fn trained_tokens(&self) -> usize {
        self.response.len()
    }
}

/// `run.batch` samples of uniform token ids below the vocabulary size,
/// seeded by `run.seed`; a quarter of each is prompt. A session trains the
/// same samples every step, so the loss falls as LoRA fits them.
pub fn samples(run: &Resolved) -> Vec<Sample> {
    let mut rng = ChaCha8Rng::seed_from_u64(run.seed);
    let vocab = u32::try_from(run.shape.vocab).unwrap_or(u32::MAX);
    let prompt_len = (run.seq_len / 4).max(1);
    (0..run.batch)
        .map(|_| {
            let mut ids = (0..run.seq_len).map(|_| rng.random_range(0..vocab));
            Sample {
                prompt: ids.by_ref().take(prompt_len).collect(),
                response: ids.collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Setup;

    #[test]
    fn samples_have_the_full_length_and_repeat_with_the_seed() {
        let mut setup = Setup::new("qwen2-tiny-4l");
        setup.batch = 4;
        setup.seed = 7;
        let run = setup.resolve().unwrap();
        let first = samples(&run);
        assert_eq!(first.len(), 4);
        for sample in &first {
            assert_eq!(sample.prompt.len() + sample.response.len(), 256);
            assert_eq!((sample.prompt.len(), sample.trained_tokens()), (64, 192));
            assert!(sample
                .prompt
                .iter()
                .chain(&sample.response)
                .all(|&id| id < 1024));
        }
        assert_ne!(first[0], first[1]);
        assert_eq!(samples(&run), first);
        setup.seed = 8;
        assert_ne!(samples(&setup.resolve().unwrap()), first);
    }

    #[test]
    fn the_shortest_sample_still_trains_a_token() {
        let mut setup = Setup::new("qwen2-tiny-4l");
        setup.seq_len = Some(2);
        let sample = &samples(&setup.resolve().unwrap())[0];
        assert_eq!((sample.prompt.len(), sample.response.len()), (1, 1));
    }
}
