//! Compile-time guarantees of the public API: transports move to their rank's thread, errors
//! cross threads. (`Node` and `Handlers` are deliberately not `Send`: handlers may capture
//! `Rc`, and progress is single-threaded per rank, as in GASNet's SEQ mode.)

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
