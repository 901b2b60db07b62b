//! Symmetric allocations and frees ([`crate::symmetric`]): collectives of a team whose
//! completion changes this rank's heap. An allocation is an all-reduce (by maximum) of each
//! member's proposal; a free is a barrier. Either is applied here when its collective
//! completes, whether or not its handle is still held, so every member's heap moves the same
//! way. One runs at a time: the next waits to start until it completes.

use std::task::{ready, Poll};

use super::coll::{Args, Data};
use super::Endpoint;
use crate::error::AmError;
use crate::handler::Threading;
use crate::op::Op;
use crate::protocol::CollectiveKind;
use crate::reduce::{Element, ReduceOp, Reduction};
use crate::symmetric::{Heap, HeapOp, HeapStep, Symmetric};
use crate::team::Team;
use crate::transport::Transport;

impl<H: Threading> Endpoint<H> {
    /// Makes this rank's symmetric heap the last `bytes` bytes of its segment
    /// ([`crate::Config::symmetric_size`]): an error if they do not fit. Set before the
    /// first allocation; every member of a team must set the same size.
    pub fn set_symmetric_size(&mut self, bytes: usize) -> Result<(), crate::config::ConfigError> {
        let heap = Heap::new(self.seg_len, bytes).map_err(|why| crate::config::ConfigError {
            var: "AM_SYMMETRIC_SIZE",
            value: bytes.to_string(),
            why,
        })?;
        self.teams.heap = heap;
        Ok(())
    }

    /// The bytes of this rank's symmetric heap.
    pub fn symmetric_size(&self) -> usize {
        self.teams.heap.size()
    }

    /// Whether a symmetric collective is in flight, advanced first (a driver waiting for
    /// the next one to start polls, and the collectives go on only where something advances
    /// them). One whose slot has completed without passing through [`Endpoint::heap_end`]
    /// (a failure that ends slots wholesale: a lost member, the endpoint's end) is tidied
    /// away.
    fn heap_busy<T: Transport + ?Sized>(&mut self, t: &mut T) -> bool {
        if self.teams.heap_op.is_none() {
            return false;
        }
        self.carry_collectives(t);
        let Some(h) = &self.teams.heap_op else {
            return false;
        };
        if self.slot_pending(h.index, h.gen) {
            return true;
        }
        // It failed.
        if let Some(h) = self.teams.heap_op.take() {
            self.teams.heap.abandon(h.step);
        }
        false
    }

    /// Starts a symmetric allocation of `len` bytes on `team`
    /// ([`crate::endpoint::start::AllocSymmetric`]).
    pub fn alloc_symmetric_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        len: usize,
    ) -> Poll<Result<Op<Symmetric>, AmError>> {
        if self.heap_busy(t) {
            return Poll::Pending;
        }
        let (words, reserved) = self.teams.heap.propose(len);
        let data = crate::reduce::to_bytes(&words);
        let red = Reduction::new::<u64>(ReduceOp::Max).expect("a built-in reduction");
        let args = Args {
            kind: CollectiveKind::AllReduce,
            root: 0,
            red: Some(red),
            data: Data::Borrowed(&data),
            heap: Some(HeapStep::Alloc { len, reserved }),
            seg: None,
        };
        let (index, gen) = ready!(self.collective_start(t, team, args))?;
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Starts a symmetric free of `block` on `team`
    /// ([`crate::endpoint::start::FreeSymmetric`]): an error at once if it is not allocated
    /// here.
    pub fn free_symmetric_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        block: Symmetric,
    ) -> Poll<Result<Op<()>, AmError>> {
        if self.heap_busy(t) {
            return Poll::Pending;
        }
        if !self.teams.heap.holds(block) {
            return Poll::Ready(Err(AmError::NotSymmetric {
                offset: block.offset(),
                len: block.len(),
            }));
        }
        let args = Args {
            kind: CollectiveKind::Barrier,
            root: 0,
            red: None,
            data: Data::Borrowed(&[]),
            heap: Some(HeapStep::Free(block)),
            seg: None,
        };
        let (index, gen) = ready!(self.collective_start(t, team, args))?;
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Records the symmetric collective of slot `(index, gen)`, about to start: an
    /// allocation's proposal is reserved until the members agree.
    pub(super) fn heap_begin(&mut self, index: u32, gen: u32, step: HeapStep) {
        if let HeapStep::Alloc {
            len,
            reserved: Some(at),
        } = step
        {
            // Free: its first fit, and no other allocation ran since it was proposed.
            let taken = self.teams.heap.take(at, len);
            debug_assert!(taken);
        }
        self.teams.heap_op = Some(HeapOp { index, gen, step });
    }

    /// The symmetric collective in flight completed with `outcome`: applied to the heap,
    /// and the operation's outcome (an allocation's block, as bytes).
    pub(super) fn heap_end(
        &mut self,
        outcome: Result<Vec<u8>, AmError>,
    ) -> Result<Vec<u8>, AmError> {
        let Some(h) = self.teams.heap_op.take() else {
            return outcome;
        };
        match (h.step, outcome) {
            (HeapStep::Alloc { len, reserved }, Ok(bytes)) => self
                .teams
                .heap
                .agree(&u64::from_bytes(bytes), len, reserved)
                .map(Symmetric::to_bytes),
            (HeapStep::Free(block), Ok(bytes)) => {
                self.teams.heap.free(block);
                Ok(bytes)
            }
            (step, Err(e)) => {
                self.teams.heap.abandon(step);
                Err(e)
            }
        }
    }
}
