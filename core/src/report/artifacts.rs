//! Reproducible failures: the tensors of a falsified trial (inputs, output,
//! reference) written as one safetensors file,
//! `reports/latest/artifacts/<contract>__<test_id>.safetensors`, so anyone can
//! load them in NumPy or PyTorch and look at the exact numbers that failed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{Error, Result};

/// The folder under a report directory that holds the artifacts.
pub const ARTIFACTS_DIR: &str = "artifacts";
/// The file extension of an artifact.
pub const EXTENSION: &str = "safetensors";

/// The elements of one tensor, kept in the precision they were computed in
/// (device outputs in f32, the reference in f64).
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl TensorData {
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn dtype(&self) -> Dtype {
        match self {
            TensorData::F32(_) => Dtype::F32,
            TensorData::F64(_) => Dtype::F64,
        }
    }

    /// Little-endian bytes, as safetensors stores them.
    fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// One named tensor of an artifact. `shape`'s product equals the data length.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactTensor {
    pub name: String,
    pub data: TensorData,
    pub shape: Vec<usize>,
}

impl ArtifactTensor {
    pub fn f32(name: impl Into<String>, data: Vec<f32>, shape: Vec<usize>) -> Self {
        ArtifactTensor {
            name: name.into(),
            data: TensorData::F32(data),
            shape,
        }
    }

    pub fn f64(name: impl Into<String>, data: Vec<f64>, shape: Vec<usize>) -> Self {
        ArtifactTensor {
            name: name.into(),
            data: TensorData::F64(data),
            shape,
        }
    }
}

/// What a check attaches to a failing measurement so the engine can write it as
/// `artifacts/<contract>__<test_id>.safetensors` (the check does not know the
/// trial's name; the engine does).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailureDump {
    pub tensors: Vec<ArtifactTensor>,
    /// String metadata stored in the file header (op, shape, seed, ...).
    pub metadata: Vec<(String, String)>,
}

/// The file stem of a trial's artifact: `<contract>__<test_id>`, with every
/// character outside `[A-Za-z0-9._-]` replaced by `_` (so `::mutant` cannot
/// make a path).
pub fn artifact_stem(contract: &str, test_id: &str) -> String {
    format!("{contract}__{test_id}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes and lists artifacts in one folder.
pub struct ArtifactWriter;

impl ArtifactWriter {
    /// Writes `tensors` (and string `metadata`, e.g. seed and shape) to
    /// `dir/<stem>.safetensors` through a temp file and a rename. Returns the path.
    pub fn write(
        dir: &Path,
        stem: &str,
        tensors: &[ArtifactTensor],
        metadata: &[(String, String)],
    ) -> Result<PathBuf> {
        let path = dir.join(format!("{stem}.{EXTENSION}"));
        let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| t.data.to_le_bytes()).collect();
        let mut views = Vec::with_capacity(tensors.len());
        for (t, b) in tensors.iter().zip(&bytes) {
            let view = TensorView::new(t.data.dtype(), t.shape.clone(), b)
                .map_err(|e| invalid(&path, format!("tensor `{}`: {e}", t.name)))?;
            views.push((t.name.clone(), view));
        }
        let info: HashMap<String, String> = metadata.iter().cloned().collect();
        let info = (!info.is_empty()).then_some(info);
        let file = safetensors::tensor::serialize(views, info)
            .map_err(|e| invalid(&path, e.to_string()))?;
        super::write_bytes_atomic(&path, &file)?;
        Ok(path)
    }

    /// Reads an artifact back: its tensors (in name order) and its metadata.
    pub fn read(path: &Path) -> Result<(Vec<ArtifactTensor>, HashMap<String, String>)> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let (_, header) =
            SafeTensors::read_metadata(&bytes).map_err(|e| invalid(path, e.to_string()))?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let file = SafeTensors::deserialize(&bytes).map_err(|e| invalid(path, e.to_string()))?;
        let mut names = file.names();
        names.sort_unstable();
        let mut tensors = Vec::with_capacity(names.len());
        for name in names {
            let view = file
                .tensor(name)
                .map_err(|e| invalid(path, e.to_string()))?;
            let data = match view.dtype() {
                Dtype::F32 => TensorData::F32(
                    view.data()
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                ),
                Dtype::F64 => TensorData::F64(
                    view.data()
                        .chunks_exact(8)
                        .map(|c| {
                            f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                        })
                        .collect(),
                ),
                other => {
                    return Err(invalid(
                        path,
                        format!(
                            "tensor `{name}` has dtype {other:?}; only F32 and F64 are written"
                        ),
                    ))
                }
            };
            tensors.push(ArtifactTensor {
                name: name.to_string(),
                data,
                shape: view.shape().to_vec(),
            });
        }
        Ok((tensors, metadata))
    }

    /// The artifacts in `dir`, sorted by name; none when the folder is missing.
    pub fn list(dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == EXTENSION))
            .collect();
        paths.sort();
        paths
    }
}

fn invalid(path: &Path, message: String) -> Error {
    Error::io(
        path,
        std::io::Error::new(std::io::ErrorKind::InvalidData, message),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reads_back_an_artifact() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![
            ArtifactTensor::f32("input_x", vec![1.0, -2.5, 3.0, 0.125, 5.0, 6.0], vec![2, 3]),
            ArtifactTensor::f32("output", vec![f32::NAN, 1.0], vec![2]),
            ArtifactTensor::f64("reference", vec![0.1, 1.0 / 3.0], vec![2]),
        ];
        let meta = vec![("seed".to_string(), "42".to_string())];
        let stem = artifact_stem("rmsnorm-v1", "F-RMS-001::mutant");
        assert_eq!(stem, "rmsnorm-v1__F-RMS-001__mutant");
        let path = ArtifactWriter::write(dir.path(), &stem, &tensors, &meta).unwrap();
        assert_eq!(ArtifactWriter::list(dir.path()), vec![path.clone()]);
        let (back, back_meta) = ArtifactWriter::read(&path).unwrap();
        assert_eq!(back_meta.get("seed").map(String::as_str), Some("42"));
        assert_eq!(back.len(), 3);
        assert_eq!(back[0], tensors[0]);
        assert_eq!(back[2], tensors[2]);
        match &back[1].data {
            TensorData::F32(v) => {
                assert!(v[0].is_nan());
                assert_eq!(v[1], 1.0);
            }
            other => panic!("dtype {other:?}"),
        }
    }

    #[test]
    fn a_shape_that_does_not_match_the_data_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bad = [ArtifactTensor::f32("x", vec![1.0; 5], vec![2, 3])];
        assert!(ArtifactWriter::write(dir.path(), "bad", &bad, &[]).is_err());
    }
}
