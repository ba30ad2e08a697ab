//! Data parallelism over NCCL: one process per GPU ([`Rank`]), each running
//! the same [`super::GpuTrainer`] step on its own shard of the batch.
//!
//! After the backward every rank all-reduces its trainable gradients with
//! `ncclAvg` in one NCCL group (the gradients are separate allocations; the
//! group makes NCCL launch them as one fused collective), so the clip and
//! AdamW see the mean gradient. The loss is a mean over tokens, so the mean
//! of equal shards' mean gradients is the full batch's mean gradient: two
//! ranks at batch B step exactly as one GPU at batch 2B does. Frozen weights
//! are never reduced. The collective is queued on the trainer's work stream,
//! so a graphed step captures it with everything else.
//!
//! NCCL needs a unique id made by one process ([`new_id`]) and handed to
//! every rank, as hex ([`Rank::join`]); `ncclCommInitRank` blocks until all
//! ranks of the world have joined.

use cudarc::nccl::{group_end, group_start, Comm, Id, ReduceOp};

use crate::error::{Error, Result};
use crate::gpu::GpuContext;

/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;

/// Whether cudarc's loader finds an NCCL library here.
pub fn nccl_present() -> bool {
    // SAFETY: only tries to open the library by its candidate names; no
    // symbol of it is called.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

fn require_nccl() -> Result<()> {
    if nccl_present() {
        Ok(())
    } else {
        Err(Error::NcclUnavailable(
            "cudarc found no libnccl.so in the library path".into(),
        ))
    }
}

fn nccl(call: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> Error {
    move |e| Error::Nccl { call, code: e.0 }
}

/// A fresh NCCL unique id, as hex. The calling process hosts NCCL's
/// bootstrap root, so it must live until every rank has joined.
pub fn new_id() -> Result<String> {
    require_nccl()?;
    let id = Id::new().map_err(nccl("ncclGetUniqueId"))?;
    Ok(id
        .internal()
        .iter()
        .map(|&c| format!("{:02x}", c as u8))
        .collect())
}

/// The id that [`new_id`] wrote as hex.
pub fn parse_id(hex: &str) -> Result<Id> {
    let bad = || Error::InvalidArgument {
        op: "nccl id",
        message: format!("expected {} hex digits, got {:?}", 2 * ID_BYTES, hex),
    };
    if hex.len() != 2 * ID_BYTES || !hex.is_ascii() {
        return Err(bad());
    }
    let mut internal: [std::ffi::c_char; ID_BYTES] = [0; ID_BYTES];
    for (i, byte) in internal.iter_mut().enumerate() {
        let v = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        *byte = v as std::ffi::c_char;
    }
    Ok(Id::uninit(internal))
}

/// This process's place in a data-parallel world: its rank, the world size
/// and its NCCL communicator on the context's work stream.
pub struct Rank {
    rank: usize,
    world: usize,
    comm: Comm,
}

impl Rank {
    /// Joins the world of `world` ranks that share the id `id_hex`, as rank
    /// `rank`, on `gpu`'s work stream. Blocks until every rank has joined.
    pub fn join(gpu: &GpuContext, rank: usize, world: usize, id_hex: &str) -> Result<Rank> {
        if world == 0 || rank >= world {
            return Err(Error::InvalidArgument {
                op: "data parallel",
                message: format!("rank {rank} of a world of {world}"),
            });
        }
        require_nccl()?;
        let id = parse_id(id_hex)?;
        let comm = Comm::from_rank(gpu.stream().clone(), rank, world, id)
            .map_err(nccl("ncclCommInitRank"))?;
        Ok(Rank { rank, world, comm })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Queues, as one NCCL group, an in-place all-reduce of every buffer:
    /// the mean over the ranks (the sum with `sum`). The group is closed
    /// even when a call in it fails.
    pub(super) fn all_reduce(
        &self,
        bufs: &mut [&mut cudarc::driver::CudaSlice<f32>],
        sum: bool,
    ) -> Result<()> {
        let op = if sum { ReduceOp::Sum } else { ReduceOp::Avg };
        group_start().map_err(nccl("ncclGroupStart"))?;
        let queued = bufs.iter_mut().try_for_each(|b| {
            self.comm
                .all_reduce_in_place(*b, &op)
                .map(|_| ())
                .map_err(nccl("ncclAllReduce"))
        });
        let ended = group_end().map_err(nccl("ncclGroupEnd"));
        queued?;
        ended.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_hex_and_bad_hex_is_refused() {
        let hex: String = (0..ID_BYTES)
            .map(|i| format!("{:02x}", (i * 7) as u8))
            .collect();
        let id = parse_id(&hex).unwrap();
        let back: String = id
            .internal()
            .iter()
            .map(|&c| format!("{:02x}", c as u8))
            .collect();
        assert_eq!(back, hex);
        assert!(parse_id("abc").is_err());
        assert!(parse_id(&"zz".repeat(ID_BYTES)).is_err());
    }
}
