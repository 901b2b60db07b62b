// `Handlers::new` takes `Send` closures only: an `Rc` needs `Handlers::local`.
use std::{cell::Cell, rc::Rc};

use am_core::{AmKind, HandlerId, Handlers};

fn main() {
    let seen = Rc::new(Cell::new(0u32));
    let mut handlers = Handlers::new();
    handlers
        .reply(HandlerId(1), "pong", AmKind::Short, move |_| seen.set(1))
        .unwrap();
}
