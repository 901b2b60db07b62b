use am_core::{AmKind, HandlerId, Handlers};

fn main() {
    let mut handlers = Handlers::local();
    handlers
        .request(HandlerId(1), "twice", AmKind::Short, |_msg, token| {
            token.reply_short(HandlerId(2), &[]).unwrap();
            token.reply_short(HandlerId(2), &[]).unwrap();
        })
        .unwrap();
}
