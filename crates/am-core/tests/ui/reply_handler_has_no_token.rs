use am_core::{AmKind, HandlerId, Handlers};

fn main() {
    let mut handlers = Handlers::local();
    // A reply handler gets only the message: there is no token to send with.
    handlers
        .reply(HandlerId(2), "pong", AmKind::Short, |_msg, token| {
            let _ = token;
        })
        .unwrap();
}
