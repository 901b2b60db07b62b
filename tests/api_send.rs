//! The facade's nodes cross threads: a node of `Send` handlers on the run-time-chosen
//! transport is `Send`, so a runtime can hand it to a progress thread or a thread pool.

fn is_send<T: Send>() {}

#[test]
fn a_node_on_any_transport_is_send() {
    is_send::<amnet::Node<amnet::AnyTransport>>();
    is_send::<amnet::Handlers>();
}
