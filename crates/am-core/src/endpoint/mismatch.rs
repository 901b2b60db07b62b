//! What differs in a collective mismatch ([`AmError::CollectiveMismatch`]): found by the
//! member whose step disagreed, carried in its notice to the others, and turned into each
//! member's words (the rule is in [`AmError::CollectiveMismatch`]'s docs).

use crate::error::{AmError, Disagreement};
use crate::protocol::CollectiveKind;
use crate::reduce::{ReduceId, ReduceOp};
use crate::team::TeamId;
use crate::types::Rank;

/// Where a chunk's count of chunks left from it sits in its word, above the reduction's
/// (17 bits: a built-in op's, or `1 << 16 | id`): the word a mismatch notice compares.
pub(super) const CHUNKS_LEFT_SHIFT: u32 = 17;

/// Bytes of a mismatch notice's payload: the field's tag, the named member's value and the
/// finder's.
pub(super) const NOTICE_LEN: usize = 17;

/// Which field differs, as a notice carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Field {
    Steps = 0,
    Kind = 1,
    Root = 2,
    Length = 3,
    ElementType = 4,
    Operation = 5,
    Chunks = 6,
    Algorithm = 7,
}

impl Field {
    fn from_u8(b: u8) -> Option<Field> {
        Some(match b {
            0 => Field::Steps,
            1 => Field::Kind,
            2 => Field::Root,
            3 => Field::Length,
            4 => Field::ElementType,
            5 => Field::Operation,
            6 => Field::Chunks,
            7 => Field::Algorithm,
            _ => return None,
        })
    }
}

/// A disagreement as codes: the field, the value of the member that differs (`peer`) and
/// of the one that agrees with the member reporting (`agrees`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Diff {
    pub(super) field: Field,
    pub(super) peer: u64,
    pub(super) agrees: u64,
}

/// What a collective's step says of it: its kind, root field and word.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sig {
    pub(super) kind: CollectiveKind,
    pub(super) root: u32,
    pub(super) desc: u32,
}

/// A reduction word's operation code (a built-in's code, `1 << 16 | id` for a user's, 0
/// for none) and element code (0 for a user's, whose element is its own).
fn op_and_elem(desc: u32) -> (u64, u64) {
    let w = desc & ((1 << CHUNKS_LEFT_SHIFT) - 1);
    if w & 1 << 16 != 0 {
        (u64::from(w), 0)
    } else {
        (u64::from(w >> 8 & 0xff), u64::from(w & 0xff))
    }
}

impl Sig {
    /// This collective's value of `field`, where its signature tells it.
    pub(super) fn value(&self, field: Field) -> Option<u64> {
        let broadcast = self.kind == CollectiveKind::Broadcast;
        match field {
            Field::Kind => Some(u64::from(self.kind.code())),
            Field::Root if self.kind != CollectiveKind::AllReduce => Some(u64::from(self.root)),
            Field::Algorithm if self.kind == CollectiveKind::AllReduce => {
                Some(u64::from(self.root))
            }
            Field::Operation if !broadcast => Some(op_and_elem(self.desc).0),
            Field::ElementType if !broadcast => Some(op_and_elem(self.desc).1),
            Field::Chunks if !broadcast => Some(u64::from(self.desc >> CHUNKS_LEFT_SHIFT)),
            _ => None,
        }
    }

    /// What differs between this collective (`mine`) and a step of `theirs` that does not
    /// agree with it: the first of kind, root, operation, element type and length.
    pub(super) fn diff(&self, theirs: &Sig) -> Diff {
        for field in [
            Field::Kind,
            Field::Root,
            Field::Algorithm,
            Field::Operation,
            Field::ElementType,
            Field::Chunks,
        ] {
            if let (Some(a), Some(p)) = (self.value(field), theirs.value(field)) {
                if a != p {
                    return Diff {
                        field,
                        peer: p,
                        agrees: a,
                    };
                }
            }
        }
        Diff::STEPS
    }
}

impl Diff {
    /// Nothing known but that the steps of a sequence disagree.
    pub(super) const STEPS: Diff = Diff {
        field: Field::Steps,
        peer: 0,
        agrees: 0,
    };

    /// Lengths in bytes that differ: `peer`'s and `agrees`'s.
    pub(super) fn length(peer: usize, agrees: usize) -> Diff {
        Diff {
            field: Field::Length,
            peer: peer as u64,
            agrees: agrees as u64,
        }
    }

    /// The same disagreement from the other side.
    pub(super) fn swapped(self) -> Diff {
        Diff {
            peer: self.agrees,
            agrees: self.peer,
            ..self
        }
    }

    /// The notice's payload.
    pub(super) fn encode(&self) -> [u8; NOTICE_LEN] {
        let mut b = [0; NOTICE_LEN];
        b[0] = self.field as u8;
        b[1..9].copy_from_slice(&self.peer.to_le_bytes());
        b[9..17].copy_from_slice(&self.agrees.to_le_bytes());
        b
    }

    /// A notice's payload back; `None` if it is not one.
    pub(super) fn decode(b: &[u8]) -> Option<Diff> {
        if b.len() != NOTICE_LEN {
            return None;
        }
        Some(Diff {
            field: Field::from_u8(b[0])?,
            peer: u64::from_le_bytes(b[1..9].try_into().ok()?),
            agrees: u64::from_le_bytes(b[9..17].try_into().ok()?),
        })
    }

    /// The error of member `agrees` finding that `peer` differs on `team`.
    pub(super) fn error(self, team: TeamId, peer: Rank, agrees: Rank) -> AmError {
        AmError::CollectiveMismatch {
            team,
            peer,
            agrees,
            what: Box::new(self.words()),
        }
    }

    /// The public form.
    fn words(self) -> Disagreement {
        let small = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let (p, a) = (self.peer, self.agrees);
        match self.field {
            Field::Steps => Disagreement::Steps,
            Field::Kind => Disagreement::Kind {
                peer: kind_name(p),
                agrees: kind_name(a),
            },
            Field::Root => Disagreement::Root {
                peer: small(p),
                agrees: small(a),
            },
            Field::Length => Disagreement::Length { peer: p, agrees: a },
            Field::Chunks => Disagreement::Chunks {
                peer: small(p),
                agrees: small(a),
            },
            Field::ElementType => Disagreement::ElementType {
                peer: elem_name(p),
                agrees: elem_name(a),
            },
            Field::Operation => Disagreement::Operation {
                peer: op_of(p),
                agrees: op_of(a),
            },
            Field::Algorithm => Disagreement::Algorithm {
                peer: algorithm_name(p),
                agrees: algorithm_name(a),
            },
        }
    }
}

fn kind_name(code: u64) -> &'static str {
    match u32::try_from(code).ok().and_then(CollectiveKind::from_code) {
        Some(CollectiveKind::Barrier) => "barrier",
        Some(CollectiveKind::AllGather) => "all-gather",
        Some(CollectiveKind::Split) => "split",
        Some(CollectiveKind::Broadcast) => "broadcast",
        Some(CollectiveKind::Reduce) => "reduce",
        Some(CollectiveKind::AllReduce) => "all-reduce",
        Some(CollectiveKind::Gather) => "gather",
        Some(CollectiveKind::PublishSegment) => "segment publication",
        Some(CollectiveKind::FreeSegment) => "segment free",
        Some(CollectiveKind::InSegment) => "collective in segment 0",
        _ => "collective of unknown kind",
    }
}

fn elem_name(code: u64) -> &'static str {
    match code {
        0 => "a user reduction's type",
        1 => "u8",
        2 => "u16",
        3 => "u32",
        4 => "u64",
        5 => "i8",
        6 => "i16",
        7 => "i32",
        8 => "i64",
        9 => "f32",
        10 => "f64",
        11 => "a Plain type",
        _ => "an unknown type",
    }
}

fn op_of(code: u64) -> Option<ReduceOp> {
    let code = u32::try_from(code).ok()?;
    if code & 1 << 16 != 0 {
        return Some(ReduceOp::User(ReduceId(code as u16)));
    }
    ReduceOp::from_code(code)
}

fn algorithm_name(code: u64) -> &'static str {
    match code {
        0 => "recursive doubling",
        _ => "ring",
    }
}

/// What differs between two members' arguments to a collective in segment 0 (their kind,
/// root, reduction word and length: [`super::in_segment`]'s first four words), `theirs`
/// against `mine`.
pub(super) fn in_segment_diff(mine: [u64; 4], theirs: [u64; 4]) -> Diff {
    let kind = |w: u64| {
        u64::from(match w {
            1 => CollectiveKind::Broadcast.code(),
            _ => CollectiveKind::AllReduce.code(),
        })
    };
    let d = |field, peer, agrees| Diff {
        field,
        peer,
        agrees,
    };
    let (pm, em) = op_and_elem(mine[2] as u32);
    let (pt, et) = op_and_elem(theirs[2] as u32);
    if mine[0] != theirs[0] {
        d(Field::Kind, kind(theirs[0]), kind(mine[0]))
    } else if mine[1] != theirs[1] {
        d(Field::Root, theirs[1], mine[1])
    } else if pm != pt {
        d(Field::Operation, pt, pm)
    } else if em != et {
        d(Field::ElementType, et, em)
    } else {
        d(Field::Length, theirs[3], mine[3])
    }
}
