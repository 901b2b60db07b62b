// A node of local handlers (which may hold an `Rc`) stays on its thread.
fn is_send<T: Send>() {}

fn main() {
    is_send::<am_core::Node<am_core::Loopback, am_core::Local>>();
}
