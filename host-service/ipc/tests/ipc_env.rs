//! Socket names from the environment, abstract sockets, and peer
//! credentials through a real listener. (Its own test binary: it sets
//! environment variables.)

mod ipc_common;

use ipc_common::serve;
use shmtrace_ipc::host::ServiceTable;
use shmtrace_ipc::protos::{producer_port, ProducerPort, SyncResponse};
use shmtrace_ipc::socket::{
    self, Listener, SocketAddress, CONSUMER_SOCKET_ENV, PRODUCER_SOCKET_ENV,
};
use shmtrace_ipc::Client;

#[test]
fn env_names_abstract_sockets_and_peer_credentials() {
    let producer = format!("@shmtrace-env-test-{}-producer", std::process::id());
    let consumer = format!("/tmp/shmtrace-env-test-{}-consumer", std::process::id());
    std::env::set_var(PRODUCER_SOCKET_ENV, &producer);
    std::env::set_var(CONSUMER_SOCKET_ENV, &consumer);
    assert_eq!(socket::producer_socket_name(), producer);
    assert_eq!(socket::consumer_socket_name(), consumer);
    std::env::set_var(PRODUCER_SOCKET_ENV, format!("{producer},/tmp/second"));
    assert_eq!(
        socket::producer_socket_names_for_service(),
        [producer.clone(), "/tmp/second".to_owned()]
    );
    std::env::remove_var(PRODUCER_SOCKET_ENV);
    std::env::remove_var(CONSUMER_SOCKET_ENV);
    let default = socket::producer_socket_name();
    assert!(
        default == "/tmp/perfetto-producer" || default == "/run/perfetto/traced-producer.sock",
        "{default}"
    );

    let address = SocketAddress::parse(&producer).unwrap();
    assert!(matches!(address, SocketAddress::Abstract(_)));
    let listener = Listener::bind(&address).unwrap();
    let accept = std::thread::spawn(move || {
        let stream = listener.accept().unwrap();
        let cred = socket::peer_credentials(&stream).unwrap();
        let server = serve(stream, ServiceTable::from(ProducerPort), |conn, call| {
            let peer = conn.peer().expect("credentials recorded at accept");
            assert_eq!(peer.pid, std::process::id() as i32);
            conn.resolve(call.reply, &SyncResponse {}).unwrap();
        });
        (cred, server)
    });
    let client = Client::connect(&address).unwrap();
    let port = client.bind::<ProducerPort>().unwrap();
    port.call::<producer_port::Sync>(&Default::default())
        .unwrap();
    let (cred, server) = accept.join().unwrap();
    assert_eq!(cred.pid, std::process::id() as i32);
    assert_eq!(cred.uid, rustix::process::getuid().as_raw());
    assert_eq!(cred.gid, rustix::process::getgid().as_raw());
    drop(port);
    drop(client);
    server.join().unwrap();
}
