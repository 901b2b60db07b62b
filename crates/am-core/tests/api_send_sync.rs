//! Compile-time guarantees of the public API: transports move to their rank's thread, a node
//! of `Send` handlers moves with them, errors cross threads. (A node of `Handlers::local`
//! is not `Send`: the `compile_fail` example of `am_core::Local`.)

use am_core::*;

fn send<T: Send>() {}
fn send_sync<T: Send + Sync>() {}

#[test]
fn transports_are_send() {
    send::<Loopback>();
    send::<FaultInjector<Loopback>>();
    send::<AbortHandle>();
}

#[test]
fn nodes_of_send_handlers_are_send() {
    send::<Handlers>();
    send::<Endpoint>();
    send::<Node<Loopback>>();
    send::<Node<FaultInjector<Loopback>, Sendable>>();
}

#[test]
fn errors_are_send_and_sync() {
    send_sync::<AmError>();
    send_sync::<TryRequestError>();
    send_sync::<StartError>();
    send_sync::<TransportError>();
    send_sync::<SendError>();
    send_sync::<RegisterError>();
    send_sync::<wire::WireError>();
    send_sync::<config::ConfigError>();
}

#[test]
fn errors_are_std_errors() {
    fn is_error<E: std::error::Error + 'static>() {}
    is_error::<AmError>();
    is_error::<StartError>();
    is_error::<TryRequestError>();
}
